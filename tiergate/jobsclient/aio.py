"""The jobs client on ``httpx.AsyncClient``: :class:`JobsClient`'s methods, awaited."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any

import httpx
from httpx_sse import aconnect_sse

from tiergate.jobsclient.base import (
    Expired,
    Follow,
    Reconnect,
    WorkspaceSource,
    check,
    idempotency_headers,
    job_body,
    options,
    workspace_bytes,
)
from tiergate.jobsclient.errors import JobsConnectionError, JobsTimeout
from tiergate.jobsclient.models import Job, JobEvent, JobList
from tiergate.queue.schema import JobCreate

EventCallback = Callable[[JobEvent], Awaitable[None] | None]


class AsyncJobsClient:
    """``/v1/jobs`` of a tiergate gateway, for asyncio; see :class:`JobsClient`.

    >>> async with AsyncJobsClient() as client:
    ...     job = await client.submit({"model": "SmolLM2-135M-Instruct", "instruction": "..."})
    ...     final = await client.wait(job.id, timeout=600)
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 30.0,
        *,
        max_stream_retries: int = 8,
        backoff_seconds: float = 0.5,
        max_backoff_seconds: float = 8.0,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        self._opts = options(
            base_url, api_key, timeout, max_stream_retries, backoff_seconds, max_backoff_seconds
        )
        self._http = http_client or httpx.AsyncClient(timeout=timeout)
        self._own_http = http_client is None

    @property
    def base_url(self) -> str:
        return self._opts.base_url

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

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {**self._opts.headers, **kwargs.pop("headers", {})}
        try:
            response = await self._http.request(
                method, self._opts.base_url + path, headers=headers, **kwargs
            )
        except httpx.TransportError as exc:
            raise JobsConnectionError(
                f"{method} {self._opts.base_url}{path}: {type(exc).__name__}: {exc}"
            ) from exc
        return check(response)

    # -- the API ----------------------------------------------------------------------------

    async def submit(
        self, job: Mapping[str, Any] | JobCreate, idempotency_key: str | None = None
    ) -> Job:
        response = await self._request(
            "POST", "/v1/jobs", json=job_body(job), headers=idempotency_headers(idempotency_key)
        )
        return Job.model_validate_json(response.content)

    async def upload_workspace(self, source: WorkspaceSource) -> str:
        body = await asyncio.to_thread(workspace_bytes, source)
        response = await self._request(
            "POST",
            "/v1/jobs/workspaces",
            content=body,
            headers={"content-type": "application/octet-stream"},
        )
        upload_id: str = response.json()["id"]
        return upload_id

    async def get(self, job_id: str) -> Job:
        response = await self._request("GET", f"/v1/jobs/{job_id}")
        return Job.model_validate_json(response.content)

    async def list(self, after: str | None = None, limit: int = 20) -> JobList:
        params: dict[str, Any] = {"limit": limit}
        if after:
            params["after"] = after
        response = await self._request("GET", "/v1/jobs", params=params)
        return JobList.model_validate_json(response.content)

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
        response = await self._request("POST", f"/v1/jobs/{job_id}/cancel")
        return Job.model_validate_json(response.content)

    async def replay(self, job_id: str) -> Job:
        """Like :meth:`JobsClient.replay`."""
        response = await self._request("POST", f"/v1/jobs/{job_id}/replay")
        return Job.model_validate_json(response.content)

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
        deadline = None if timeout is None else time.monotonic() + timeout
        status: str | None = None
        try:
            async for event in self._follow(Follow(job_id, 0, self._opts, deadline)):
                status = event.status or status
                if on_event is not None:
                    called = on_event(event)
                    if called is not None:
                        await called
        except Expired:
            raise JobsTimeout(job_id, timeout or 0.0, status) from None
        return await self.get(job_id)

    async def _follow(self, follow: Follow) -> AsyncIterator[JobEvent]:
        url = self._opts.base_url + follow.path
        while True:
            try:
                async with aconnect_sse(
                    self._http,
                    "GET",
                    url,
                    params=follow.params(),
                    headers=dict(self._opts.headers),
                    timeout=follow.timeout(),
                ) as source:
                    if source.response.status_code != 200:
                        await source.response.aread()
                        follow.opened(source.response)
                    async for sse in source.aiter_sse():
                        event = follow.take(sse.data)
                        if event is not None:
                            yield event
                        if follow.done:
                            return
                        follow.remaining()
                raise follow.ended()
            except (httpx.TransportError, Reconnect) as exc:
                delay = follow.backoff(exc)
            await asyncio.sleep(delay)
