"""The jobs client on ``httpx.Client``."""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any, TypeVar

import httpx
from httpx_sse import connect_sse

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


class JobsClient(wire.Client[httpx.Client]):
    """``/v1/jobs`` of a tiergate gateway.

    >>> with JobsClient() as client:  # $TIERGATE_BASE_URL, else http://127.0.0.1:8000
    ...     job = client.submit({"model": "SmolLM2-135M-Instruct", "instruction": "..."})
    ...     final = client.wait(job.id, timeout=600)

    Errors are :class:`~tiergate.jobsclient.errors.JobsError`: ``JobsAPIError`` (the
    gateway's error envelope: status, code, message), ``JobsConnectionError``,
    ``JobsStreamError`` and ``JobsTimeout``.
    """

    _transport = httpx.Client

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

    def _call(self, call: wire.Call[T]) -> T:
        try:
            response = self._http.request(**call.request(self._opts))
        except httpx.TransportError as exc:
            raise call.unreachable(self._opts, exc) from exc
        return call.answer(response)

    # -- the API ----------------------------------------------------------------------------

    def submit(self, job: Mapping[str, Any] | JobCreate, idempotency_key: str | None = None) -> Job:
        """Create a job (answered once the broker holds it). A retry with the same
        ``idempotency_key`` and body returns the same job instead of a second one."""
        return self._call(wire.submit(job, idempotency_key))

    def upload_workspace(self, source: WorkspaceSource) -> str:
        """Upload a starting workspace: a tar or tar.gz file, its bytes, or a directory
        (packed here). Returns the id to give as ``workspace.upload_id``."""
        return self._call(wire.upload(workspace_bytes(source)))

    def get(self, job_id: str) -> Job:
        return self._call(wire.get(job_id))

    def list(self, after: str | None = None, limit: int = 20) -> JobList:
        """One page of this key's jobs, newest first; the next page is ``after=page.last_id``."""
        return self._call(wire.list_jobs(after, limit))

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
        return self._call(wire.cancel(job_id))

    def replay(self, job_id: str) -> Job:
        """Replay a finished job: answers the new replay job (``kind: replay``), queued; a
        worker runs the recorded commands without the model, and the job ends with its
        ``replay`` report (:meth:`wait` for it)."""
        return self._call(wire.replay(job_id))

    # -- rollout batches --------------------------------------------------------------------

    def upload_tasks(self, source: TasksSource) -> str:
        """Upload a batch's tasks as JSON lines: a .jsonl file, its bytes, or the tasks
        (mappings). Returns the id to give as ``tasks_upload_id``; the tasks are checked
        line by line as they arrive."""
        return self._call(wire.upload_tasks(tasks_bytes(source)))

    def submit_batch(
        self,
        tasks: Iterable[Mapping[str, Any]] | None = None,
        samples_per_task: int = 4,
        *,
        tasks_upload_id: str | None = None,
        **options: Any,
    ) -> Batch:
        """A rollout batch: ``tasks`` (job specs, each with ``domain`` and ``task_id``) or
        ``tasks_upload_id`` (:meth:`upload_tasks`), ``samples_per_task``, and the rest of
        ``BatchCreate`` as keywords (``rounds``, ``domain_weights``, ``budget``,
        ``max_in_flight``, ...)."""
        body = wire.batch_body(tasks, samples_per_task, tasks_upload_id, options)
        return self._call(wire.submit_batch(body))

    def get_batch(self, batch_id: str) -> Batch:
        return self._call(wire.get_batch(batch_id))

    def cancel_batch(self, batch_id: str) -> Batch:
        """Idempotent: nothing more of it starts; its queued jobs are cancelled."""
        return self._call(wire.cancel_batch(batch_id))

    def rollouts(self, batch_id: str) -> builtins.list[dict[str, Any]]:
        """The batch's finished rollouts, as the export's JSON lines (one dict each)."""
        return self._call(wire.batch_rollouts(batch_id))

    def groups(
        self,
        batch_id: str,
        starting_after: int = 0,
        poll_seconds: float = 2.0,
        timeout: float | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Each complete group of the batch once, as it completes (one task's samples of
        one round, with their records and rewards normalized within the group), until the
        batch has ended and every group was read. Resume with the last group's ``seq``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        after = starting_after
        while True:
            page = self._call(wire.batch_groups(batch_id, after))
            for group in page.groups:
                after = group["seq"]
                yield group
            if page.groups:
                continue
            if page.ended:
                return
            if deadline is not None and time.monotonic() > deadline:
                raise JobsTimeout(batch_id, timeout or 0.0, "in_progress")
            time.sleep(poll_seconds)

    def wait_batch(
        self,
        batch_id: str,
        timeout: float | None = None,
        on_progress: Callable[[Batch], None] | None = None,
        poll_seconds: float = 2.0,
    ) -> Batch:
        """Poll the batch until nothing of it runs; each reading to ``on_progress``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            batch = self.get_batch(batch_id)
            if on_progress is not None:
                on_progress(batch)
            if batch.finished:
                return batch
            if deadline is not None and time.monotonic() > deadline:
                raise JobsTimeout(batch_id, timeout or 0.0, batch.status)
            time.sleep(poll_seconds)

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
        follow = wire.Wait(job_id, timeout, self._opts)
        try:
            for event in self._follow(follow):
                if on_event is not None:
                    on_event(event)
        except Expired:
            raise follow.expired() from None
        return self.get(job_id)

    def _follow(self, follow: Follow) -> Iterator[JobEvent]:
        while True:
            try:
                with connect_sse(self._http, **wire.stream(self._opts, follow)) as source:
                    if source.response.status_code != 200:
                        source.response.read()
                        follow.opened(source.response)
                    for sse in source.iter_sse():
                        yield from wire.take(follow, sse.data)
                        if wire.over(follow):
                            return
                raise follow.ended()
            except (httpx.TransportError, Reconnect) as exc:
                delay = follow.backoff(exc)
            time.sleep(delay)
