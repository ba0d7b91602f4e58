"""A worker joins a consumer group that earlier workers formed with another assignor.

Tansu keeps a group's protocol once set, even while the group is empty: a ``make up``
restarted over the data of a release whose workers used ``range`` left every job
``queued`` for good (the worker's joins were refused with InconsistentGroupProtocolError,
and the retry forwarder's thread died of it). Here the earlier release's members are
plain consumers that join both groups with ``range`` and leave; a worker configured with
the default ``cooperative-sticky`` must still run jobs, forward retries, stay healthy, and
say on ``/healthz`` which assignor it joined with."""

from __future__ import annotations

from pathlib import Path

import httpx
from kafka import KafkaConsumer
from kafka.coordinator.assignors.range import RangePartitionAssignor

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.jobstack import jobs_stack, topic_messages
from tests.waiting import eventually
from tiergate.jobsettings import JobsSettings

TASK = {
    "model": MODEL,
    "instruction": "say hello",
    "limits": {"max_steps": 1},
    "verifier": {"command": "true"},
}


def _form_group_with_range(jobs: JobsSettings, topic: str, group: str) -> None:
    consumer = KafkaConsumer(
        bootstrap_servers=jobs.kafka.bootstrap_servers,
        group_id=group,
        enable_auto_commit=False,
        session_timeout_ms=6000,  # the broker holds a join for about half of it
        heartbeat_interval_ms=500,
        partition_assignment_strategy=[RangePartitionAssignor],
    )
    try:
        consumer.subscribe([topic])
        eventually(lambda: consumer.poll(200) is not None and consumer.assignment(), 60, 0.1)
    finally:
        consumer.close()


def test_a_worker_joins_a_group_that_earlier_workers_formed_with_another_assignor(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    with jobs_stack(
        broker, s3, model, tmp_path, worker={"max_attempts": 2, "retry_backoff_seconds": 0.5}
    ) as stack:
        kafka = stack.jobs.kafka
        _form_group_with_range(stack.jobs, kafka.topic, kafka.group)
        _form_group_with_range(stack.jobs, kafka.retry_topic, f"{kafka.group}-retry")
        assert kafka.assignment == "cooperative-sticky"

        model.behaviour.mode = "status"
        model.behaviour.status = 503  # the first attempt fails: its retry must be forwarded
        job = stack.submit(TASK)
        worker = stack.start_worker()
        final = stack.wait(job["id"], lambda j: j["status"] == "failed", timeout=120)
        assert final["error"]["code"] == "transient_failures", final
        assert final["attempts"] == 2  # the retry went through the retry group
        assert [d["id"] for d in topic_messages(stack.jobs, kafka.dead_letter_topic)] == [job["id"]]

        assert worker.healthy(), worker.liveness.healthy()
        groups = worker.memberships
        assert groups[kafka.group].assignor == "range"
        assert groups[f"{kafka.group}-retry"].assignor == "range"
        assert groups[kafka.group].refusals >= 1


def test_a_worker_serves_its_groups_assignors_on_healthz(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    with jobs_stack(broker, s3, model, tmp_path) as stack:
        jobs = stack.worker_settings()
        stack.start_worker(jobs, serve_http=True)
        port = jobs.worker.metrics_port
        body = eventually(
            lambda: httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).json(), 30, 0.2
        )
        group = body["groups"][jobs.kafka.group]
        assert group == {
            "configured": "cooperative-sticky",
            "offered": "cooperative-sticky",
            "refusals": 0,
        }
