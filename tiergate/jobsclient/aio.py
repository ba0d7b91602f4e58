"""The jobs client on ``httpx.AsyncClient``: :class:`JobsClient`'s methods, awaited."""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, TypeVar

import httpx
from httpx_sse import aconnect_sse

from tiergate.jobsclient import wire
from tiergate.jobsclient.base import (
    Expired,
    Follow,
    Reconnect,
    TasksSource,
    WorkspaceSource,
    tasks_bytes,
    workspace_bytes,
)
from tiergate.jobsclient.errors import JobsTimeout
from tiergate.jobsclient.models import Batch, Job, JobEvent, JobList
from tiergate.protocol import JobCreate

T = TypeVar("T")
EventCallback = Callable[[JobEvent], Awaitable[None] | None]


class AsyncJobsClient(wire.Client[httpx.AsyncClient]):
    """``/v1/jobs`` of a tiergate gateway, for asyncio; see :class:`JobsClient`.

    >>> async with AsyncJobsClient() as client:
    ...     job = await client.submit({"model": "SmolLM2-135M-Instruct", "instruction": "..."})
    ...     final = await client.wait(job.id, timeout=600)
    """

    _transport = httpx.AsyncClient

    async def aclose(self) -> None:
        if self._own_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncJobsClient:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _call(self, call: wire.Call[T]) -> T:
        try:
            response = await self._http.request(**call.request(self._opts))
        except httpx.TransportError as exc:
            raise call.unreachable(self._opts, exc) from exc
        return call.answer(response)

    # -- the API ----------------------------------------------------------------------------

    async def submit(
        self, job: Mapping[str, Any] | JobCreate, idempotency_key: str | None = None
    ) -> Job:
        return await self._call(wire.submit(job, idempotency_key))

    async def upload_workspace(self, source: WorkspaceSource) -> str:
        body = await asyncio.to_thread(workspace_bytes, source)
        return await self._call(wire.upload(body))

    async def get(self, job_id: str) -> Job:
        return await self._call(wire.get(job_id))

    async def list(self, after: str | None = None, limit: int = 20) -> JobList:
        return await self._call(wire.list_jobs(after, limit))

    async def iter_jobs(self, page_size: int = 100) -> AsyncIterator[Job]:
        after = None
        while True:
            page = await self.list(after=after, limit=page_size)
            for job in page.data:
                yield job
            if not page.has_more or not page.last_id:
                return
            after = page.last_id

    async def cancel(self, job_id: str) -> Job:
        return await self._call(wire.cancel(job_id))

    async def replay(self, job_id: str) -> Job:
        """Like :meth:`JobsClient.replay`."""
        return await self._call(wire.replay(job_id))

    async def upload_tasks(self, source: TasksSource) -> str:
        """Like :meth:`JobsClient.upload_tasks`."""
        body = await asyncio.to_thread(tasks_bytes, source)
        return await self._call(wire.upload_tasks(body))

    async def submit_batch(
        self,
        tasks: Iterable[Mapping[str, Any]] | None = None,
        samples_per_task: int = 4,
        *,
        tasks_upload_id: str | None = None,
        **options: Any,
    ) -> Batch:
        """Like :meth:`JobsClient.submit_batch`."""
        body = wire.batch_body(tasks, samples_per_task, tasks_upload_id, options)
        return await self._call(wire.submit_batch(body))

    async def get_batch(self, batch_id: str) -> Batch:
        return await self._call(wire.get_batch(batch_id))

    async def cancel_batch(self, batch_id: str) -> Batch:
        return await self._call(wire.cancel_batch(batch_id))

    async def rollouts(self, batch_id: str) -> builtins.list[dict[str, Any]]:
        return await self._call(wire.batch_rollouts(batch_id))

    async def groups(
        self,
        batch_id: str,
        starting_after: int = 0,
        poll_seconds: float = 2.0,
        timeout: float | None = None,  # noqa: ASYNC109 (JobsClient.groups' signature)
    ) -> AsyncIterator[dict[str, Any]]:
        """Like :meth:`JobsClient.groups`: ``async for group in client.groups(batch_id)``."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        after = starting_after
        while True:
            page = await self._call(wire.batch_groups(batch_id, after))
            for group in page.groups:
                after = group["seq"]
                yield group
            if page.groups:
                continue
            if page.ended:
                return
            if deadline is not None and loop.time() > deadline:
                raise JobsTimeout(batch_id, timeout or 0.0, "in_progress")
            await asyncio.sleep(poll_seconds)

    async def wait_batch(
        self,
        batch_id: str,
        timeout: float | None = None,  # noqa: ASYNC109 (JobsClient.wait_batch's signature)
        on_progress: Callable[[Batch], None] | None = None,
        poll_seconds: float = 2.0,
    ) -> Batch:
        """Like :meth:`JobsClient.wait_batch`."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            batch = await self.get_batch(batch_id)
            if on_progress is not None:
                on_progress(batch)
            if batch.finished:
                return batch
            if deadline is not None and loop.time() > deadline:
                raise JobsTimeout(batch_id, timeout or 0.0, batch.status)
            await asyncio.sleep(poll_seconds)

    def events(self, job_id: str, starting_after: int = 0) -> AsyncIterator[JobEvent]:
        """``async for event in client.events(job_id)``: resumes after a dropped connection."""
        return self._follow(Follow(job_id, starting_after, self._opts, None))

    async def wait(
        self,
        job_id: str,
        timeout: float | None = None,  # noqa: ASYNC109 (JobsClient.wait's signature)
        on_event: EventCallback | None = None,
    ) -> Job:
        """Like :meth:`JobsClient.wait`; ``on_event`` may be a function or a coroutine
        function."""
        follow = wire.Wait(job_id, timeout, self._opts)
        try:
            async for event in self._follow(follow):
                if on_event is not None:
                    called = on_event(event)
                    if called is not None:
                        await called
        except Expired:
            raise follow.expired() from None
        return await self.get(job_id)

    async def _follow(self, follow: Follow) -> AsyncIterator[JobEvent]:
        while True:
            try:
                async with aconnect_sse(self._http, **wire.stream(self._opts, follow)) as source:
                    if source.response.status_code != 200:
                        await source.response.aread()
                        follow.opened(source.response)
                    async for sse in source.aiter_sse():
                        for event in wire.take(follow, sse.data):
                            yield event
                        if wire.over(follow):
                            return
                raise follow.ended()
            except (httpx.TransportError, Reconnect) as exc:
                delay = follow.backoff(exc)
            await asyncio.sleep(delay)
