"""The jobs client on ``httpx.Client``."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import Any

import httpx
from httpx_sse import connect_sse

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


class JobsClient:
    """``/v1/jobs`` of a tiergate gateway.

    >>> with JobsClient() as client:  # $TIERGATE_BASE_URL, else http://127.0.0.1:8000
    ...     job = client.submit({"model": "SmolLM2-135M-Instruct", "instruction": "..."})
    ...     final = client.wait(job.id, timeout=600)

    Errors are :class:`~tiergate.jobsclient.errors.JobsError`: ``JobsAPIError`` (the
    gateway's error envelope: status, code, message), ``JobsConnectionError``,
    ``JobsStreamError`` and ``JobsTimeout``.
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
        http_client: httpx.Client | None = None,
    ) -> None:
        self._opts = options(
            base_url, api_key, timeout, max_stream_retries, backoff_seconds, max_backoff_seconds
        )
        self._http = http_client or httpx.Client(timeout=timeout)
        self._own_http = http_client is None

    @property
    def base_url(self) -> str:
        return self._opts.base_url

    def close(self) -> None:
        if self._own_http:
            self._http.close()

    def __enter__(self) -> JobsClient:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {**self._opts.headers, **kwargs.pop("headers", {})}
        try:
            response = self._http.request(
                method, self._opts.base_url + path, headers=headers, **kwargs
            )
        except httpx.TransportError as exc:
            raise JobsConnectionError(
                f"{method} {self._opts.base_url}{path}: {type(exc).__name__}: {exc}"
            ) from exc
        return check(response)

    # -- the API ----------------------------------------------------------------------------

    def submit(self, job: Mapping[str, Any] | JobCreate, idempotency_key: str | None = None) -> Job:
        """Create a job (answered once the broker holds it). A retry with the same
        ``idempotency_key`` and body returns the same job instead of a second one."""
        response = self._request(
            "POST", "/v1/jobs", json=job_body(job), headers=idempotency_headers(idempotency_key)
        )
        return Job.model_validate_json(response.content)

    def upload_workspace(self, source: WorkspaceSource) -> str:
        """Upload a starting workspace: a tar or tar.gz file, its bytes, or a directory
        (packed here). Returns the id to give as ``workspace.upload_id``."""
        response = self._request(
            "POST",
            "/v1/jobs/workspaces",
            content=workspace_bytes(source),
            headers={"content-type": "application/octet-stream"},
        )
        upload_id: str = response.json()["id"]
        return upload_id

    def get(self, job_id: str) -> Job:
        return Job.model_validate_json(self._request("GET", f"/v1/jobs/{job_id}").content)

    def list(self, after: str | None = None, limit: int = 20) -> JobList:
        """One page of this key's jobs, newest first; the next page is ``after=page.last_id``."""
        params: dict[str, Any] = {"limit": limit}
        if after:
            params["after"] = after
        return JobList.model_validate_json(self._request("GET", "/v1/jobs", params=params).content)

    def iter_jobs(self, page_size: int = 100) -> Iterator[Job]:
        """Every job of this key, newest first, a page at a time."""
        after = None
        while True:
            page = self.list(after=after, limit=page_size)
            yield from page.data
            if not page.has_more or not page.last_id:
                return
            after = page.last_id

    def cancel(self, job_id: str) -> Job:
        """Idempotent: a queued job ends at once, a running one within seconds."""
        return Job.model_validate_json(self._request("POST", f"/v1/jobs/{job_id}/cancel").content)

    def replay(self, job_id: str) -> Job:
        """Replay a finished job: answers the new replay job (``kind: replay``), queued; a
        worker runs the recorded commands without the model, and the job ends with its
        ``replay`` report (:meth:`wait` for it)."""
        return Job.model_validate_json(self._request("POST", f"/v1/jobs/{job_id}/replay").content)

    def events(self, job_id: str, starting_after: int = 0) -> Iterator[JobEvent]:
        """The job's events after ``starting_after``, in order, until its terminal event.
        A dropped connection is resumed from the last event seen: none is lost or repeated."""
        return self._follow(Follow(job_id, starting_after, self._opts, None))

    def wait(
        self,
        job_id: str,
        timeout: float | None = None,
        on_event: Callable[[JobEvent], None] | None = None,
    ) -> Job:
        """Follow the job's events (each to ``on_event``) until it ends; returns the job
        as it ended, with its artifacts. :class:`JobsTimeout` after ``timeout`` seconds
        (the job itself goes on)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        status: str | None = None
        try:
            for event in self._follow(Follow(job_id, 0, self._opts, deadline)):
                status = event.status or status
                if on_event is not None:
                    on_event(event)
        except Expired:
            raise JobsTimeout(job_id, timeout or 0.0, status) from None
        return self.get(job_id)

    def _follow(self, follow: Follow) -> Iterator[JobEvent]:
        url = self._opts.base_url + follow.path
        while True:
            try:
                with connect_sse(
                    self._http,
                    "GET",
                    url,
                    params=follow.params(),
                    headers=dict(self._opts.headers),
                    timeout=follow.timeout(),
                ) as source:
                    if source.response.status_code != 200:
                        source.response.read()
                        follow.opened(source.response)
                    for sse in source.iter_sse():
                        event = follow.take(sse.data)
                        if event is not None:
                            yield event
                        if follow.done:
                            return
                        follow.remaining()
                raise follow.ended()
            except (httpx.TransportError, Reconnect) as exc:
                delay = follow.backoff(exc)
            time.sleep(delay)
