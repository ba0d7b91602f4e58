"""Relaying an upstream answer to the client as it arrives, with a deadline on each write.

Two things make a relay safe against the client rather than the engine. The engine's body
is read only as fast as the client takes it (the upstream connection stops reading at its
high-water mark), so gateway memory stays bounded whatever the answer's size. And a client
that stops reading cannot park the relay in its write forever: each write must be taken
within ``write_seconds``, or the answer is cut and its admission slot and limits lease come
back. A slow client is never counted against the engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from tiergate.gateway.openai.upstream import Opened

# Where a JSON answer's usage object is looked for: its last bytes (vLLM puts it last).
_TAIL_BYTES = 4096

CLIENT_STALLED = "client_stalled"


class RelayResponse(StreamingResponse):
    """A streaming response that notices a client disconnect even while upstream is silent
    (Starlette only notices on the next write under ASGI 2.4), so the upstream request is
    cancelled at once, and that cuts a client that takes no write within ``write_seconds``.
    ``cleanup`` runs however the response ends, even when the body iterator never started;
    it is told :data:`CLIENT_STALLED` when the write deadline cut the answer, else None."""

    def __init__(
        self,
        content: AsyncIterator[bytes],
        cleanup: Callable[[str | None], None],
        write_seconds: float,
        **kwargs: Any,
    ) -> None:
        super().__init__(content, **kwargs)
        self._cleanup = cleanup
        self._write_seconds = write_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        deadline = _WriteDeadline(self._write_seconds)

        async def send_within(message: Message) -> None:
            since = deadline.since = deadline.loop.time()
            try:
                await send(message)
            finally:
                deadline.since = None
                self.waited(deadline.loop.time() - since)

        stream = asyncio.ensure_future(self.stream_response(send_within))
        listen = asyncio.ensure_future(self.listen_for_disconnect(receive))
        deadline.watch(stream)
        try:
            await asyncio.wait({stream, listen}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            deadline.stop()
            for task in (stream, listen):
                task.cancel()
            results = await asyncio.gather(stream, listen, return_exceptions=True)
            self._cleanup(CLIENT_STALLED if deadline.stalled else None)
        failure = results[0]
        if isinstance(failure, Exception) and not isinstance(failure, OSError):
            raise failure

    def waited(self, seconds: float) -> None:
        """Told how long each write took the client to take (uvicorn's ``send`` returns at
        once unless the client's socket is full): for a subclass that keeps it."""


class _WriteDeadline:
    """One timer per relayed answer, not one per write (an ``asyncio.timeout`` context
    costs about 10 us a write warm under uvloop, a few times that cold, and a stream
    writes every chunk).

    A write records when it began (``since``). The timer, when it fires, cuts a write
    that has waited ``seconds``; otherwise it fires again when the current write would
    reach that, or ``seconds`` from now when none is waiting. A write is so cut exactly
    ``seconds`` after it began: a timer set while no write waited fires before any later
    write's deadline."""

    __slots__ = ("_task", "_timer", "loop", "seconds", "since", "stalled")

    def __init__(self, seconds: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.seconds = seconds
        self.since: float | None = None
        self.stalled = False  # the client's doing: the engine's timeouts are the body's
        self._task: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    def watch(self, task: asyncio.Future[None]) -> None:
        self._task = task
        self._timer = self.loop.call_later(self.seconds, self._check)

    def _check(self) -> None:
        now = self.loop.time()
        since = self.since
        if since is not None and now - since >= self.seconds:
            self._timer = None
            self.stalled = True
            if self._task is not None:
                self._task.cancel()
            return
        at = since + self.seconds if since is not None else now + self.seconds
        self._timer = self.loop.call_at(at, self._check)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class BodyRelay:
    """A non-streamed answer passed through as it arrives (a ``/tokenize`` of a long
    prompt, large embeddings): no copy of the whole body is kept, only its last bytes,
    where the answer's ``usage`` is read from at the end. An engine that breaks or stalls
    mid-body is an engine failure (the client sees a short body: its status has gone)."""

    def __init__(self, opened: Opened) -> None:
        self._opened = opened
        self._tail = b""
        self.complete = False
        self.broken = False  # the engine's side broke or stalled mid-body

    async def body(self) -> AsyncIterator[bytes]:
        reader = self._opened.response
        try:
            while chunk := await reader.readany():
                if len(chunk) >= _TAIL_BYTES:
                    self._tail = chunk[-_TAIL_BYTES:]
                else:
                    self._tail = (self._tail + chunk)[-_TAIL_BYTES:]
                yield chunk
        except OSError:  # TimeoutError too: the engine, not the client
            self.broken = True
            self._opened.endpoint.record_failure()
            raise
        self.complete = True

    def usage(self) -> dict[str, Any] | None:
        """The answer's ``usage`` object, when its last bytes hold one."""
        return usage_in_tail(self._tail) if self.complete else None


def usage_in_tail(tail: bytes) -> dict[str, Any] | None:
    """The last ``"usage": {...}`` object in ``tail`` (a JSON answer's end), or None."""
    at = tail.rfind(b'"usage"')
    start = tail.find(b"{", at) if at >= 0 else -1
    if start < 0:
        return None
    depth = 0
    for i in range(start, len(tail)):
        byte = tail[i]
        if byte == 0x7B:  # {
            depth += 1
        elif byte == 0x7D:  # }
            depth -= 1
            if depth == 0:
                try:
                    found = orjson.loads(tail[start : i + 1])
                except orjson.JSONDecodeError:
                    return None
                return found if isinstance(found, dict) else None
    return None
