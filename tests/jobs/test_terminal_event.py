"""A job's event stream ends with exactly one terminal event, however many writers end it.

Seen in CI (tests/jobs/test_scaling.py, a fleet through a broker restart): a job with two
``job.incomplete`` events. The worker that ended the job wrote its terminal record, and
before its terminal event landed a second worker, handed the same message again after the
rebalance, found the record without an event (:meth:`JobLifecycle.ensure_terminal_event`,
for a writer that died between the two) and wrote the event too. These tests put the two
writers' steps in that order by hand, on a real S3 API server."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tiergate.jobs.state.lifecycle import JobLifecycle
from tiergate.jobs.state.store import JobStore
from tiergate.jobsettings import StorageSettings
from tiergate.protocol import JobCreate, JobMessage, JobStatus

SPEC = JobCreate.model_validate(
    {"model": "m", "instruction": "do it", "verifier": {"command": "true"}}
)


@pytest.fixture
def store(s3: str) -> JobStore:
    store = JobStore(StorageSettings(endpoint_url=s3, bucket=f"terminal-{uuid.uuid4().hex[:8]}"))
    store.ensure_bucket()
    return store


def _terminal(store: JobStore, job_id: str) -> list[dict[str, Any]]:
    return [e for e in store.events(job_id, 0) if e["type"] == "job.incomplete"]


def _running(store: JobStore) -> tuple[JobLifecycle, str]:
    gateway = JobLifecycle(store)
    job = gateway.new_job(f"job_{uuid.uuid4().hex}", "team-a", SPEC)
    assert gateway.create(job, SPEC)
    # The gateway's process accepts jobs for as long as it runs: it keeps nothing per job.
    assert gateway._sequence == {}
    return gateway, job.id


def test_a_second_worker_between_the_record_and_its_event_writes_no_second_event(
    store: JobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, job_id = _running(store)
    first, second = JobLifecycle(store), JobLifecycle(store)
    job = store.get(job_id)
    assert job is not None
    message = JobMessage(id=job_id, owner="team-a", spec=SPEC)
    job = first.start(message, 1, run=1)
    finalize = store.finalize

    def finalize_then_the_other_worker_looks(ended: Any) -> bool:
        won = finalize(ended)
        final = store.final(job_id)
        assert won and final is not None
        second.ensure_terminal_event(final)  # it sees the record and no event yet
        return won

    monkeypatch.setattr(store, "finalize", finalize_then_the_other_worker_looks)
    first.finish(job, JobStatus.INCOMPLETE, incomplete="max_steps")
    monkeypatch.undo()
    assert len(_terminal(store, job_id)) == 1
    second.ensure_terminal_event(store.final(job_id))  # type: ignore[arg-type]
    assert len(_terminal(store, job_id)) == 1
    sequences = [e["sequence_number"] for e in store.events(job_id, 0)]
    assert sequences == list(range(1, len(sequences) + 1))


def test_a_terminal_event_whose_write_landed_but_whose_answer_was_lost_is_not_written_again(
    store: JobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conditional PUT retried after a lost answer finds its own object (412): the
    writer must see its event there, not take the next number for a second copy."""
    _, job_id = _running(store)
    worker = JobLifecycle(store)
    job = worker.start(JobMessage(id=job_id, owner="team-a", spec=SPEC), 1, run=1)
    put_once = store.objects.put_once

    def lands_but_answers_taken(key: str, body: bytes, **kw: Any) -> bool:
        landed = put_once(key, body, **kw)
        return False if landed and b"job.incomplete" in body else landed

    monkeypatch.setattr(store.objects, "put_once", lands_but_answers_taken)
    worker.finish(job, JobStatus.INCOMPLETE, incomplete="max_steps")
    monkeypatch.undo()
    assert len(_terminal(store, job_id)) == 1


def test_a_number_refused_while_nothing_is_there_is_tried_again_not_skipped(
    store: JobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S3 may refuse a conditional PUT with 409 while a concurrent write to the key is
    still landing, and that write may land or fail. Moving past the number would put the
    terminal event after a gap, where a writer from a lower number could add another."""
    _, job_id = _running(store)
    worker = JobLifecycle(store)
    job = worker.start(JobMessage(id=job_id, owner="team-a", spec=SPEC), 1, run=1)
    put_once = store.objects.put_once
    refused: list[str] = []

    def refused_once_unwritten(key: str, body: bytes, **kw: Any) -> bool:
        if b"job.incomplete" in body and not refused:
            refused.append(key)  # the other write failed: nothing lands here
            return False
        return put_once(key, body, **kw)

    monkeypatch.setattr(store.objects, "put_once", refused_once_unwritten)
    worker.finish(job, JobStatus.INCOMPLETE, incomplete="max_steps")
    monkeypatch.undo()
    assert refused and len(_terminal(store, job_id)) == 1
    sequences = [e["sequence_number"] for e in store.events(job_id, 0)]
    assert sequences == list(range(1, len(sequences) + 1))  # no gap
    assert refused[0].endswith(f"{sequences[-1]:08d}.json")  # the same number, again


def test_the_event_of_a_writer_that_died_after_the_record_is_written_on_the_next_delivery(
    store: JobStore,
) -> None:
    _, job_id = _running(store)
    job = store.get(job_id)
    assert job is not None
    job.status = JobStatus.INCOMPLETE
    assert store.finalize(job)  # the writer dies here: a record, no event
    assert _terminal(store, job_id) == []
    JobLifecycle(store).ensure_terminal_event(job)
    assert len(_terminal(store, job_id)) == 1
