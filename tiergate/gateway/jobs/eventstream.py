"""Job event streams (``GET /v1/jobs/{id}/events``) as the calling key's own cost.

A stream is a loop of storage reads for as long as the client stays, so three things keep
a key's streams from slowing every other tenant:

- at most ``jobs.max_streams_per_key`` open at once per key on a gateway replica (the next
  is a 429 ``rate_limit_exceeded`` naming the limit; counted in this process: a stream is
  bound to the replica serving it, and a lease in Redis would outlive a crashed replica's
  streams for no gain);
- the polls back off while nothing happens: :data:`FIRST_POLL_SECONDS`, growing by
  :data:`BACKOFF` to :data:`MAX_POLL_SECONDS`, back to the first as soon as an event comes;
- every read is charged to the owner's read budget (tiergate.gateway.access.readcost): the
  first one, before the response starts, is a 429 past it, and the polls after it wait
  for the budget instead, so a key's streams slow down together and never another key's;
- they run on a bounded thread pool of their own (``jobs.stream_threads``,
  tiergate.gateway.jobs.threads), never the storage threads that creates, reads and
  uploads use: a thousand streams queue behind each other, not in front of a submit.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Executor
from typing import Any

import orjson
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from tiergate.gateway.access.auth import Caller
from tiergate.gateway.access.readcost import ReadBudget
from tiergate.gateway.errors import OpenAIError
from tiergate.jobs.state.store import JobStore, StorageError
from tiergate.protocol import TERMINAL_EVENTS, TERMINAL_STATUSES, Batch
from tiergate.protocol.batches import GroupRef

FIRST_POLL_SECONDS = 0.5
MAX_POLL_SECONDS = 4.0
BACKOFF = 1.5
# A comment line after this long without an event keeps proxies from closing the stream.
KEEPALIVE_SECONDS = 15.0

Unavailable = Callable[[str, Exception], OpenAIError]


def next_poll(delay: float, found: bool) -> float:
    """The wait before the next read: the first again after events, else a longer one."""
    return FIRST_POLL_SECONDS if found else min(MAX_POLL_SECONDS, delay * BACKOFF)


class _SlotResponse(StreamingResponse):
    """A stream that gives its key's slot back when it ends, however it ends (finished,
    the client gone, the server stopping)."""

    def __init__(self, content: AsyncIterator[bytes], release: Callable[[], None]) -> None:
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


class EventStreams:
    """Opens and feeds one gateway replica's event streams."""

    def __init__(
        self,
        store: JobStore,
        pool: Executor,
        max_per_key: int,
        unavailable: Unavailable,
        reads: ReadBudget,
    ) -> None:
        self._store = store
        self._reads = reads
        self._pool = pool
        self._max_per_key = max_per_key
        self._unavailable = unavailable
        self._open: dict[str, int] = {}

    def open_count(self, name: str) -> int:
        return self._open.get(name, 0)

    async def _in_pool(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def _poll(self, caller: Caller, fn: Callable[..., Any], *args: Any) -> Any:
        """A stream's next read, once the owner's read budget allows it."""
        return await self._reads.read_when_allowed(caller, self._in_pool, fn, *args)

    def _take(self, caller: Caller) -> Callable[[], None]:
        held = self._open.get(caller.owner, 0)
        if held >= self._max_per_key:
            raise OpenAIError(
                429,
                f"This key has {held} event streams open, its limit "
                f"(jobs.max_streams_per_key: {self._max_per_key}); close one first.",
                code="rate_limit_exceeded",
                type_="rate_limit_error",
                headers={"retry-after": "5"},
            )
        self._open[caller.owner] = held + 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            left = self._open.get(caller.owner, 1) - 1
            if left > 0:
                self._open[caller.owner] = left
            else:
                self._open.pop(caller.owner, None)

        return release

    async def open_batch(
        self, caller: Caller, read: Callable[[], Batch | None]
    ) -> StreamingResponse:
        """A batch's rollouts as they finish (``batch.rollout``, each once, in the order
        they were seen finished; on connecting, every one finished so far), then
        ``batch.<status>`` and ``[DONE]`` once nothing of it runs. ``read``: the batch as
        stored (the caller checked it is the caller's). The same per-key cap and backoff
        as a job's stream."""
        release, first = await self._first(caller, read)
        return _SlotResponse(self._batch_stream(caller, read, first), release)

    async def _batch_stream(
        self, caller: Caller, read: Callable[[], Batch | None], batch: Batch | None
    ) -> AsyncIterator[bytes]:
        sent: set[str] = set()

        async def rollouts(current: Batch) -> AsyncIterator[bytes]:
            for rollout in current.rollouts:
                if rollout.status in TERMINAL_STATUSES and rollout.job_id not in sent:
                    sent.add(rollout.job_id)
                    event = {"type": "batch.rollout", **rollout.model_dump(mode="json")}
                    yield b"data: " + orjson.dumps(event) + b"\n\n"

        async for chunk in self._follow_batch(caller, read, batch, rollouts):
            yield chunk

    async def open_batch_groups(
        self,
        caller: Caller,
        read: Callable[[], Batch | None],
        after: int,
        build: Callable[[Batch, GroupRef], Awaitable[dict[str, Any]]],
    ) -> StreamingResponse:
        """A batch's groups as they complete (``batch.group``, each once, in ``seq``
        order, after ``after``; the event's ``id`` is the ``seq``), then ``batch.<status>``
        and ``[DONE]`` once the batch ended and every group was sent. ``build``: a group's
        record. The same per-key cap and backoff as a job's stream."""
        release, first = await self._first(caller, read)
        last = after

        async def groups(current: Batch) -> AsyncIterator[bytes]:
            nonlocal last
            for ref in [g for g in current.groups if g.seq > last]:
                event = {"type": "batch.group", **(await build(current, ref))}
                last = ref.seq
                yield f"id: {ref.seq}\n".encode() + b"data: " + orjson.dumps(event) + b"\n\n"

        return _SlotResponse(self._follow_batch(caller, read, first, groups), release)

    async def _follow_batch(
        self,
        caller: Caller,
        read: Callable[[], Batch | None],
        batch: Batch | None,
        fresh: Callable[[Batch], AsyncIterator[bytes]],
    ) -> AsyncIterator[bytes]:
        """What ``fresh`` finds new in the batch at each poll, then ``batch.<status>`` and
        ``[DONE]`` once it ended (its last news sent first)."""
        delay = FIRST_POLL_SECONDS
        idle = 0.0
        while batch is not None:
            news = False
            async for chunk in fresh(batch):
                news = True
                yield chunk
            if batch.status != "in_progress" and batch.completed_at is not None:
                done = {"type": f"batch.{batch.status}", "batch": batch.public()}
                yield b"data: " + orjson.dumps(done) + b"\n\n"
                yield b"data: [DONE]\n\n"
                return
            if news:
                idle = 0.0
            elif idle >= KEEPALIVE_SECONDS:
                idle = 0.0
                yield b": keep-alive\n\n"
            await asyncio.sleep(delay)
            idle += delay
            try:
                batch = await self._poll(caller, read)
            except StorageError as exc:
                err = self._unavailable("store", exc)
                yield b"data: " + orjson.dumps(err.envelope()) + b"\n\n"
                return
            delay = next_poll(delay, news)

    async def open(self, caller: Caller, job_id: str, starting_after: int) -> StreamingResponse:
        """The stream of ``job_id``'s events after ``starting_after`` (the job is the
        caller's: the caller checked)."""
        release, first = await self._first(caller, self._store.events, job_id, starting_after)
        return _SlotResponse(self._stream(caller, job_id, starting_after, first), release)

    async def _first(
        self, caller: Caller, fn: Callable[..., Any], *args: Any
    ) -> tuple[Callable[[], None], Any]:
        """Take the key's slot and make the stream's first read before the response
        starts, so that a store that is down is a 503 like every other route, not a 200
        stream that breaks at once; the slot goes back if that fails."""
        release = self._take(caller)
        try:
            return release, await self._reads.read(caller, self._in_pool, fn, *args)
        except StorageError as exc:
            release()
            raise self._unavailable("store", exc) from exc
        except BaseException:
            release()
            raise

    async def _stream(
        self, caller: Caller, job_id: str, after: int, found: list[dict[str, Any]]
    ) -> AsyncIterator[bytes]:
        idle = 0.0
        delay = FIRST_POLL_SECONDS
        while True:
            for event in found:
                after = event["sequence_number"]
                yield b"data: " + orjson.dumps(event) + b"\n\n"
                if event["type"] in TERMINAL_EVENTS:
                    yield b"data: [DONE]\n\n"
                    return
            if found:
                idle = 0.0
            elif idle >= KEEPALIVE_SECONDS:
                idle = 0.0
                yield b": keep-alive\n\n"
                # A finished job whose terminal event never came (its worker died in
                # between; the next delivery writes it) must not hold the stream open.
                try:
                    if await self._poll(caller, self._store.final, job_id) is not None:
                        yield b"data: [DONE]\n\n"
                        return
                except StorageError:
                    pass
            await asyncio.sleep(delay)
            idle += delay
            try:
                found = await self._poll(caller, self._store.events, job_id, after)
            except StorageError as exc:
                # Mid-stream the status line is gone: say so in the stream, and the client
                # resumes with starting_after.
                err = self._unavailable("store", exc)
                yield b"data: " + orjson.dumps(err.envelope()) + b"\n\n"
                return
            delay = next_poll(delay, bool(found))
