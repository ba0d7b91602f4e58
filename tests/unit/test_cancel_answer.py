"""A running job's cancel answers that the cancel was requested even when the worker's own
write of the record (a step) lands between the cancel's write and its read: the record is
the last writer's, the request stands by its marker. Seen once in a loaded CI run
(tests/jobs/test_jobs.py::test_cancel_running_job_stops_it_within_seconds). A fake store
whose read returns the worker's copy."""

from __future__ import annotations

from typing import Any

from tiergate.jobs.state.lifecycle import JobLifecycle
from tiergate.protocol.jobs import Job, JobStatus


class RacedStore:
    """A fake: writes are recorded, and a read returns the worker's copy (no cancel)."""

    def __init__(self, worker_copy: Job) -> None:
        self.worker_copy = worker_copy
        self.cancel_markers: list[str] = []
        self.written: list[Job] = []

    def request_cancel(self, job_id: str) -> None:
        self.cancel_markers.append(job_id)

    def put_status(self, job: Job) -> None:
        self.written.append(job.model_copy())

    def get(self, job_id: str) -> Job:
        return self.worker_copy.model_copy()


def _running() -> Job:
    fields: dict[str, Any] = {
        "id": "job_" + "0" * 32,
        "owner": "alice",
        "status": JobStatus.IN_PROGRESS,
        "model": "m",
        "service_tier": "default",
        "created_at": 1,
        "created_ms": 1000,
    }
    return Job(**fields)


def test_the_cancel_says_it_was_requested_when_a_workers_write_raced_it() -> None:
    store = RacedStore(_running())
    answer = JobLifecycle(store).cancel(_running())  # type: ignore[arg-type]
    assert store.cancel_markers == [answer.id]
    assert answer.cancel_requested_at is not None
    assert answer.status is JobStatus.IN_PROGRESS
