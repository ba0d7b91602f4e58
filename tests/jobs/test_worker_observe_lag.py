"""Queue lag of a consumer group, measured on a real Kafka-protocol broker."""

from __future__ import annotations

import uuid

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.structs import OffsetAndMetadata

from tiergate.jobs.run.observe import WorkerMetrics
from tiergate.queue.lag import LagUnavailable, measure_lag


def test_lag_is_what_the_group_has_not_committed(broker: str) -> None:
    topic, group = f"lag-{uuid.uuid4().hex[:8]}", f"lag-group-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=broker)
    try:
        admin.create_topics([NewTopic(topic, 2, 1)])
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=broker, acks="all")
    try:
        for i in range(5):
            producer.send(topic, value=f"job-{i}".encode(), partition=0).get(timeout=10)
    finally:
        producer.close(timeout=5)

    # Before any commit: the whole log is waiting.
    assert measure_lag(broker, group, topic, timeout_s=10) == {0: 5, 1: 0}

    tp = TopicPartition(topic, 0)
    consumer = KafkaConsumer(
        bootstrap_servers=broker,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    try:
        consumer.assign([tp])
        taken: list[bytes] = []
        for _ in range(50):
            for records in consumer.poll(timeout_ms=200, max_records=2 - len(taken)).values():
                taken += [r.value for r in records]
            if len(taken) >= 2:
                break
        assert taken == [b"job-0", b"job-1"]
        consumer.commit({tp: OffsetAndMetadata(2, "", -1)})
    finally:
        consumer.close(autocommit=False)

    lags = measure_lag(broker, group, topic, timeout_s=10)
    assert lags == {0: 3, 1: 0}
    assert sum(lags.values()) == 3

    metrics = WorkerMetrics()
    metrics.set_lags(topic, lags)
    assert (
        metrics.registry.get_sample_value(
            "tiergate_jobs_queue_lag", {"topic": topic, "partition": "0"}
        )
        == 3
    )


def test_an_unknown_topic_is_a_clear_error(broker: str) -> None:
    with pytest.raises(LagUnavailable, match="not found"):
        measure_lag(broker, "g", f"absent-{uuid.uuid4().hex[:8]}", timeout_s=3)
