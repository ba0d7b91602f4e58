"""A worker that idles looks at the other partitions' queued jobs every
``steal_after_seconds`` (tiergate.jobs.run.steal). The soak (issue 54) saw each look open a
new Kafka consumer (a connection and a coordinator lookup every 2 s per idle worker) and
log an ERROR from kafka-python when it closed ("Metadata refresh: failed Cancelled"). Now
one consumer serves every look, and what each look answers is still read afresh from the
group's committed positions. Real broker; the store is a fake (named) that says every job
is queued."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.structs import OffsetAndMetadata

import tiergate.queue.lag
from tiergate.jobs.run.steal import Stealer
from tiergate.jobsettings import JobsSettings
from tiergate.protocol import Job, JobCreate, JobMessage, JobStatus

SPEC = JobCreate.model_validate({"model": "m", "instruction": "i"})


class FakeQueuedStore:
    """A fake job store: every job it is asked about is queued."""

    def get(self, job_id: str) -> Job:
        return Job(
            id=job_id,
            owner="o",
            status=JobStatus.QUEUED,
            model="m",
            service_tier="default",
            created_at=1,
        )


def _commit(broker: str, group: str, tp: TopicPartition, offset: int) -> None:
    consumer = KafkaConsumer(bootstrap_servers=broker, group_id=group, enable_auto_commit=False)
    try:
        consumer.assign([tp])
        consumer.commit({tp: OffsetAndMetadata(offset, "", -1)})
    finally:
        consumer.close(autocommit=False)


def test_an_idle_workers_looks_share_one_consumer_and_see_fresh_commits(
    broker: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    topic, group = f"steal-{uuid.uuid4().hex[:8]}", f"steal-group-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=broker)
    try:
        admin.create_topics([NewTopic(topic, 2, 1)])
    finally:
        admin.close()
    ids = [f"job_{uuid.uuid4().hex}" for _ in range(3)]
    producer = KafkaProducer(bootstrap_servers=broker, acks="all")
    try:
        for job_id in ids:
            message = JobMessage(id=job_id, owner="o", spec=SPEC).model_dump_json().encode()
            producer.send(topic, key=job_id.encode(), value=message, partition=0).get(timeout=10)
    finally:
        producer.close(timeout=5)
    p0 = TopicPartition(topic, 0)
    _commit(broker, group, p0, 1)  # the first job was taken by its partition's owner

    made: list[Any] = []

    class CountedConsumer(KafkaConsumer):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made.append(self)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(tiergate.queue.lag, "KafkaConsumer", CountedConsumer)
    settings = JobsSettings.model_validate(
        {"kafka": {"bootstrap_servers": broker, "topic": topic, "group": group, "partitions": 2}}
    )
    stealer = Stealer(settings, FakeQueuedStore())  # type: ignore[arg-type]
    owned = {TopicPartition(topic, 1)}  # this worker owns the other partition
    caplog.set_level(logging.INFO, logger="kafka")
    try:
        offered = []
        for _ in range(5):
            found = stealer.candidates(1, owned)
            offered.append([JobMessage.model_validate_json(v).id for _, _, v in found])
            stealer._taken.clear()  # offer the same job again: each look reads afresh
        assert offered == [[ids[1]]] * 5
        _commit(broker, group, p0, 2)  # the owner moved on: the next look sees it
        assert [
            JobMessage.model_validate_json(v).id for _, _, v in stealer.candidates(1, owned)
        ] == [ids[2]]
    finally:
        stealer.close()
    assert len(made) == 1, f"{len(made)} consumers for 6 looks"
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []
