"""Faults between the gateway, the broker and the object store: every storage failure is
a 503 with retry-after on every jobs route, a broker that is down keeps nothing, and a
restart of the broker or of the object store loses no accepted job and needs no help."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.jobstack import jobs_stack
from tests.servers import free_port, running_gateway
from tests.waiting import eventually
from tiergate.jobs.run.context import RunContext
from tiergate.jobs.run.runner import JobRunner
from tiergate.jobs.run.worker import Worker
from tiergate.jobs.state.lifecycle import JobLifecycle
from tiergate.jobs.state.store import JobStore
from tiergate.jobs.state.sweep import Sweeper
from tiergate.local.servers import ObjectStore, Server
from tiergate.protocol import JobCreate, JobMessage
from tiergate.queue.pipeline import JobQueue
from tiergate.sandbox.cgroup import find_parent

SOLVE = "```bash\necho $(( 6 * 7 )) > answer.txt\n```"
TASK: dict[str, Any] = {
    "model": MODEL,
    "instruction": "Write six times seven into answer.txt.",
    "verifier": {"command": 'test "$(cat answer.txt)" = 42'},
    "limits": {"max_steps": 3, "timeout_seconds": 60},
}
TERMINAL = ("completed", "failed", "cancelled", "incomplete")


def _routes(base: str, job_id: str) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        ("POST", f"{base}/v1/jobs", {"json": TASK}),
        ("POST", f"{base}/v1/jobs/workspaces", {"content": b"tar"}),
        ("GET", f"{base}/v1/jobs", {}),
        ("GET", f"{base}/v1/jobs/{job_id}", {}),
        ("POST", f"{base}/v1/jobs/{job_id}/cancel", {}),
        ("GET", f"{base}/v1/jobs/{job_id}/events", {}),
    ]


def test_object_store_down_is_503_on_every_jobs_route(
    broker: str, model: FakeVllm, tmp_path: Path
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with jobs_stack(broker, dead, model, tmp_path, ensure=False) as stack:
        for method, url, kwargs in _routes(stack.base, "job_" + "0" * 32):
            resp = httpx.request(method, url, timeout=30, **kwargs)
            assert resp.status_code == 503, (method, url, resp.text)
            assert resp.headers["retry-after"] == "5"
            error = resp.json()["error"]
            assert error["code"] == "store_unavailable"
            assert stack.jobs.storage.bucket not in error["message"]
            assert "127.0.0.1" not in error["message"]


def test_broker_down_is_503_on_submit_and_nothing_is_kept(
    s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    dead = f"127.0.0.1:{free_port()}"
    with jobs_stack(
        dead, s3, model, tmp_path, ensure=False, jobs={"kafka": {"request_timeout_seconds": 1.0}}
    ) as stack:
        JobStore(stack.jobs.storage).ensure_bucket()
        resp = httpx.post(f"{stack.base}/v1/jobs", json=TASK, timeout=30)
        assert resp.status_code == 503, resp.text
        assert resp.json()["error"]["code"] == "queue_unavailable"
        assert resp.headers["retry-after"] == "5"
        assert httpx.get(f"{stack.base}/v1/jobs").json()["data"] == []
        assert list(JobStore(stack.jobs.storage).pending()) == []


def test_restarts_of_broker_and_object_store_lose_nothing(
    pipeline: tuple[ObjectStore, Server], model: FakeVllm, tmp_path: Path
) -> None:
    store_server, broker_server = pipeline
    model.behaviour.replies = [SOLVE, "DONE"]
    with jobs_stack(broker_server.address, store_server.url, model, tmp_path) as stack:
        before = stack.submit(TASK)["id"]
        broker_server.restart()
        # The producer and the topics come back by themselves.
        after_broker = _submit_eventually(stack.base)
        store_server.restart()
        # Just restarted, the store may still answer errors for a moment (a 503
        # store_unavailable, as documented); the API recovers by itself, and the job is there.
        assert _get_eventually(stack.base, before)["status"] == "queued"
        after_store = _submit_eventually(stack.base)
        stack.start_worker()
        for job_id in (before, after_broker, after_store):
            final = stack.wait(job_id, lambda j: j["status"] in TERMINAL, timeout=120)
            assert final["status"] == "completed", final


def _get_eventually(base: str, job_id: str, timeout: float = 60) -> dict[str, Any]:
    def got() -> dict[str, Any] | None:
        resp = httpx.get(f"{base}/v1/jobs/{job_id}", timeout=30)
        if resp.status_code == 200:
            return dict(resp.json())
        assert resp.status_code == 503, resp.text
        assert resp.json()["error"]["code"] == "store_unavailable", resp.text
        return None

    return eventually(got, timeout, 0.5, "the jobs API recovered")


def _submit_eventually(base: str, timeout: float = 60) -> str:
    def submitted() -> str | None:
        resp = httpx.post(f"{base}/v1/jobs", json=TASK, timeout=30)
        if resp.status_code == 200:
            return str(resp.json()["id"])
        assert resp.status_code == 503, resp.text
        return None

    return eventually(submitted, timeout, 0.5, "the jobs API recovered")


def test_a_vanished_bucket_is_created_again_on_demand(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    with jobs_stack(broker, s3, model, tmp_path) as stack:
        bucket = stack.jobs.storage.bucket
        client = boto3.client("s3", endpoint_url=s3, region_name="us-east-1")
        client.delete_bucket(Bucket=bucket)
        resp = httpx.post(f"{stack.base}/v1/jobs", json=TASK, timeout=30)
        assert resp.status_code == 200, resp.text
        assert httpx.get(f"{stack.base}/v1/jobs").json()["data"][0]["id"] == resp.json()["id"]


def test_a_job_whose_message_was_lost_is_sent_again_then_failed(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    model.behaviour.replies = [SOLVE, "DONE"]
    with jobs_stack(broker, s3, model, tmp_path, jobs={"requeue_after_seconds": 60}) as stack:
        store = JobStore(stack.jobs.storage)
        queue = JobQueue(stack.jobs.kafka)
        lifecycle = JobLifecycle(store)
        spec = JobCreate.model_validate(TASK)
        clock = [1000.0]  # the sweeper's own monotonic clock, moved by hand
        sweeper = Sweeper(store, queue, stack.jobs, clock=lambda: clock[0])
        # A gateway that died between recording a job and producing its message.
        lost = lifecycle.new_job("job_" + "1" * 32, "anonymous", spec)
        lifecycle.create(lost, spec)
        assert sweeper.run() == 0  # found missing now: watched, not yet overdue
        clock[0] += 59
        assert sweeper.run() == 0
        clock[0] += 2
        assert sweeper.run() == 1  # missing for 61 s of the sweeper's watch: sent again
        clock[0] += 100
        assert sweeper.run() == 0  # its message is in the topic now: waiting its turn
        stack.start_worker()
        assert stack.wait(lost.id, lambda j: j["status"] in TERMINAL)["status"] == "completed"
        # A re-sent job whose message is missing again is failed after another deadline.
        never = lifecycle.new_job("job_" + "2" * 32, "anonymous", spec)
        lifecycle.create(never, spec)
        assert store.mark_resent(never.id)  # as if re-sent, and that message lost too
        assert sweeper.run() == 0
        clock[0] += 61
        assert sweeper.run() == 1
        final = httpx.get(f"{stack.base}/v1/jobs/{never.id}").json()
        assert final["status"] == "failed" and final["error"]["code"] == "never_delivered"
        assert list(store.pending()) == []
        queue.close()


def test_a_job_that_keeps_killing_its_worker_is_failed_after_max_attempts(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    with jobs_stack(broker, s3, model, tmp_path, worker={"max_attempts": 2}) as stack:
        job = stack.submit(TASK)
        store = JobStore(stack.jobs.storage)
        # Two pickups that never finished: their workers died mid-job.
        store.record_delivery(job["id"])
        store.record_delivery(job["id"])
        runner = JobRunner(RunContext(stack.jobs, store, JobQueue(stack.jobs.kafka)))
        message = JobMessage(id=job["id"], owner="anonymous", spec=JobCreate.model_validate(TASK))
        assert runner.process(message) == "dead"
        final = httpx.get(f"{stack.base}/v1/jobs/{job['id']}").json()
        assert final["status"] == "failed" and final["error"]["code"] == "crashed_workers"
        assert model.record.requests == 0  # it did not run a third time
        # The sandbox made as it was picked up (tiergate.jobs.run.runner) is gone with its
        # waiting first process: no workspace, no cgroup left behind.
        assert not list(Path(stack.jobs.sandbox.work_dir).glob(f"{job['id']}*"))
        parent = find_parent(stack.jobs.sandbox)
        assert not [d for d in parent.dirs if list(d.glob(f"job-{job['id']}*"))]


def test_idempotency_key_and_outstanding_cap(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    with jobs_stack(broker, s3, model, tmp_path, jobs={"max_outstanding_jobs": 2}) as stack:
        url = f"{stack.base}/v1/jobs"
        headers = {"idempotency-key": "retry-1"}
        first = httpx.post(url, json=TASK, headers=headers).json()
        again = httpx.post(url, json=TASK, headers=headers).json()
        assert first["id"] == again["id"]
        assert len(httpx.get(url).json()["data"]) == 1
        assert httpx.post(url, json=TASK).status_code == 200
        over = httpx.post(url, json=TASK)
        assert over.status_code == 429, over.text
        assert over.json()["error"]["code"] == "too_many_outstanding_jobs"
        httpx.post(f"{url}/{first['id']}/cancel")  # a finished job frees its place
        assert httpx.post(url, json=TASK).status_code == 200


def test_an_acknowledged_submit_survives_a_sigkilled_broker(
    pipeline: tuple[ObjectStore, Server], model: FakeVllm, tmp_path: Path
) -> None:
    """What answered 200 ``queued`` is in the broker's storage: SIGKILL right after the
    acknowledgement loses nothing (an in-memory broker would lose it all)."""
    store_server, broker_server = pipeline
    model.behaviour.replies = [SOLVE, "DONE"]
    with jobs_stack(broker_server.address, store_server.url, model, tmp_path) as stack:
        acknowledged = stack.submit(TASK)["id"]
        broker_server.stop(kill=True)
        broker_server.start()
        stack.start_worker()
        final = stack.wait(acknowledged, lambda j: j["status"] in TERMINAL, timeout=120)
        assert final["status"] == "completed", final


def test_workers_take_no_job_while_the_gateway_is_away(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A stack still starting (or a gateway rollout) does not burn jobs' attempts: the
    job waits queued, then runs once the gateway answers."""
    model.behaviour.replies = [SOLVE, "DONE"]
    later = free_port()
    with jobs_stack(
        broker, s3, model, tmp_path, worker={"max_attempts": 2, "retry_backoff_seconds": 0.2}
    ) as stack:
        job = stack.submit(TASK)
        jobs = stack.jobs.model_copy(deep=True)
        jobs.gateway_url = f"http://127.0.0.1:{later}"
        caplog.set_level(logging.INFO, logger="tiergate.worker")
        worker = Worker(jobs)
        worker.start()
        try:
            # The slot parks before it consumes anything (without the wait it would have
            # taken the job and burnt its two attempts on the missing gateway).
            eventually(
                lambda: "waiting for the gateway" in caplog.text, 30, 0.1, "the slot waiting"
            )
            assert worker.processed == []
            assert httpx.get(f"{stack.base}/v1/jobs/{job['id']}").json()["status"] == "queued"
            with running_gateway(stack.settings, port=later):
                final = stack.wait(job["id"], lambda j: j["status"] in TERMINAL, timeout=60)
            assert final["status"] == "completed" and final["attempts"] == 1, final
        finally:
            worker.stop(drain_seconds=0)
