"""A consumer group's lag on a topic: the log end offset minus the committed offset, per
partition (a partition the group never committed on lags by its whole log).

The log end is the larger of the broker's ListOffsets answer and the high watermark of a
fetch from there: Tansu 0.6's S3 storage engine (the broker of ``tiergate up`` and the job
tests) answers ListOffsets(latest) with a stale offset, while its fetches carry the right
high watermark. On Kafka itself the fetch starts at the end and returns no records.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from tiergate.jobsettings import KafkaSettings


class LagUnavailable(Exception):
    """The lag could not be measured; the message says why (for the caller's log)."""


def _reader(
    bootstrap_servers: str,
    group: str,
    timeout_ms: int,
    client_options: dict[str, Any] | None,
    **fetch: int,
) -> KafkaConsumer:
    """A consumer of ``group`` that will assign partitions itself: it never joins the
    group (no rebalance of the workers) and commits nothing."""
    try:
        return KafkaConsumer(
            **{**(client_options or {}), "bootstrap_servers": bootstrap_servers},
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            request_timeout_ms=timeout_ms,
            bootstrap_timeout_ms=timeout_ms,
            **fetch,
        )
    except (KafkaError, TimeoutError) as exc:
        raise LagUnavailable(f"{bootstrap_servers}: {type(exc).__name__}: {exc}") from exc


@contextmanager
def _at_committed(
    bootstrap_servers: str,
    group: str,
    topic: str,
    timeout_ms: int,
    client_options: dict[str, Any] | None,
    what: str,
) -> Iterator[tuple[KafkaConsumer, list[TopicPartition]]]:
    """A reader of ``group`` with every partition of ``topic`` assigned and at the group's
    committed position (the log's start where the group has none or its records are gone),
    closed after the block without committing. Whatever the client raises becomes
    :class:`LagUnavailable`, naming ``what`` was read."""
    consumer = _reader(bootstrap_servers, group, timeout_ms, client_options, fetch_max_wait_ms=50)
    try:
        partitions = [
            TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])
        ]
        if not partitions:
            raise LagUnavailable(f"topic {topic!r} not found on {bootstrap_servers}")
        starts = consumer.beginning_offsets(partitions, timeout_ms=timeout_ms)
        consumer.assign(partitions)
        for tp in partitions:
            committed = consumer.committed(tp, timeout_ms=timeout_ms)
            consumer.seek(tp, max(starts[tp], committed or 0))
        yield consumer, partitions
    except LagUnavailable:
        raise
    except (KafkaError, KeyError, TimeoutError, AssertionError) as exc:
        raise LagUnavailable(
            f"{what} of group {group!r} on {topic!r}: {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        consumer.close(autocommit=False)


def _drop_read_to_end(consumer: KafkaConsumer, left: set[TopicPartition]) -> None:
    """Take out of ``left`` the partitions read up to the high watermark of their fetches."""
    for tp in list(left):
        high = consumer.highwater(tp)
        if high is not None and consumer.position(tp) >= high:
            left.discard(tp)


def measure_lag(
    bootstrap_servers: str,
    group: str,
    topic: str,
    timeout_s: float = 5.0,
    client_options: dict[str, Any] | None = None,
) -> dict[int, int]:
    """``{partition: messages waiting}`` for ``group`` on ``topic``.

    The consumer assigns partitions itself and never subscribes, so it does not join the
    group (no rebalance of the workers) and commits nothing. Raises :class:`LagUnavailable`.
    """
    deadline = time.monotonic() + timeout_s
    timeout_ms = max(1, int(timeout_s * 1000))
    consumer = _reader(
        bootstrap_servers,
        group,
        timeout_ms,
        client_options,
        # At most one record batch per partition comes back (KIP-74).
        max_partition_fetch_bytes=1,
        fetch_max_bytes=1,
        fetch_max_wait_ms=10,
    )
    try:
        partitions = [
            TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))
        ]
        if not partitions:
            raise LagUnavailable(f"topic {topic!r} not found on {bootstrap_servers}")
        ends = consumer.end_offsets(partitions, timeout_ms=timeout_ms)
        consumer.assign(partitions)
        for tp in partitions:
            consumer.seek(tp, ends[tp])
        while any(consumer.highwater(tp) is None for tp in partitions):
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                raise LagUnavailable(f"no fetch answer from {topic!r} in {timeout_s:g}s")
            consumer.poll(timeout_ms=min(100, left_ms), update_offsets=False)
        lags: dict[int, int] = {}
        for tp in partitions:
            end = max(ends[tp], consumer.highwater(tp) or 0)
            committed = consumer.committed(tp, timeout_ms=timeout_ms)
            lags[tp.partition] = max(0, end - (committed or 0))
        return lags
    except LagUnavailable:
        raise
    except (KafkaError, KeyError, TimeoutError) as exc:
        raise LagUnavailable(
            f"lag of group {group!r} on {topic!r}: {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        consumer.close(autocommit=False)


def keys_ahead(
    bootstrap_servers: str,
    group: str,
    topic: str,
    timeout_s: float = 20.0,
    client_options: dict[str, Any] | None = None,
) -> set[str]:
    """The keys (job ids) of every message on ``topic`` at or past ``group``'s committed
    position: the backlog, and the records taken but not yet committed. Like
    :func:`measure_lag` it assigns partitions itself (no rebalance, no commit), and reads
    each partition up to the high watermark its fetches report. Raises
    :class:`LagUnavailable` when it cannot read all of it in ``timeout_s``: a partial
    answer would make present messages look lost."""
    deadline = time.monotonic() + timeout_s
    timeout_ms = max(1, int(timeout_s * 1000))
    where = (bootstrap_servers, group, topic)
    with _at_committed(*where, timeout_ms, client_options, "backlog") as (consumer, partitions):
        keys: set[str] = set()
        left = set(partitions)
        while left:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                raise LagUnavailable(f"{topic!r} not read to its end in {timeout_s:g}s")
            for records in consumer.poll(timeout_ms=min(200, left_ms)).values():
                keys.update(r.key.decode() for r in records if r.key)
            _drop_read_to_end(consumer, left)
        return keys


def backlog_reader(kafka: KafkaSettings, group: str, topic: str) -> Callable[[], set[str]]:
    """:func:`keys_ahead` of ``group`` on ``topic``, on ``kafka``'s brokers with its client
    options, as a call (the sweeps' view of what is still in the queue)."""

    def read() -> set[str]:
        return keys_ahead(
            kafka.bootstrap_servers, group, topic, client_options=kafka.client_options()
        )

    return read


def _first_records(
    consumer: KafkaConsumer,
    partitions: list[TopicPartition],
    per_partition: int,
    deadline: float,
) -> list[tuple[TopicPartition, int, bytes]]:
    """Up to ``per_partition`` records of each partition from the consumer's positions,
    until ``deadline`` (``time.monotonic()``)."""
    found: dict[TopicPartition, list[tuple[TopicPartition, int, bytes]]] = {
        tp: [] for tp in partitions
    }
    left = set(partitions)
    while left and time.monotonic() < deadline:
        polled = consumer.poll(timeout_ms=100, max_records=per_partition * len(partitions))
        for tp, records in polled.items():
            for record in records:
                if len(found[tp]) < per_partition:
                    found[tp].append((tp, record.offset, record.value))
            if len(found[tp]) >= per_partition:
                consumer.pause(tp)
                left.discard(tp)
        _drop_read_to_end(consumer, left)
    return [entry for tp in partitions for entry in found[tp]]


class AheadReader:
    """The first ``per_partition`` messages (partition, offset, value) of each partition of
    ``topic`` at or past ``group``'s committed position, in offset order per partition:
    what a worker with a free slot may take over from a busy one (tiergate.jobs.run.steal).
    What could not be read in ``timeout_s`` is left out; :class:`LagUnavailable` when
    nothing can be read. One consumer serves every look.

    A worker with a free slot looks every ``steal_after_seconds`` (2 s) while it idles; a
    consumer per look was, per idle worker, a new connection and coordinator lookup every
    2 s, and an ERROR line from kafka-python each time it was closed with its metadata
    refresh in flight ("Metadata refresh: failed Cancelled"; seen by the soak, issue 54).
    Each look still reads the group's committed positions from the broker
    (``KafkaConsumer.committed`` always asks), as a consumer per look did. A look that
    fails drops the consumer; the next starts afresh.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        group: str,
        topic: str,
        timeout_s: float = 5.0,
        client_options: dict[str, Any] | None = None,
    ) -> None:
        self._where = (bootstrap_servers, group, topic)
        self._timeout_s = timeout_s
        self._client_options = client_options
        self._consumer: KafkaConsumer | None = None
        self._lock = threading.Lock()  # a consumer is one thread's at a time

    def read(self, per_partition: int) -> list[tuple[TopicPartition, int, bytes]]:
        with self._lock:
            return self._read(per_partition)

    def _read(self, per_partition: int) -> list[tuple[TopicPartition, int, bytes]]:
        bootstrap_servers, group, topic = self._where
        deadline = time.monotonic() + self._timeout_s
        timeout_ms = max(1, int(self._timeout_s * 1000))
        if self._consumer is None:
            self._consumer = _reader(
                bootstrap_servers, group, timeout_ms, self._client_options, fetch_max_wait_ms=50
            )
        consumer = self._consumer
        try:
            partitions = [
                TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])
            ]
            if not partitions:
                raise LagUnavailable(f"topic {topic!r} not found on {bootstrap_servers}")
            starts = consumer.beginning_offsets(partitions, timeout_ms=timeout_ms)
            # Fresh partition states (assign keeps a partition's, its high watermark and
            # pause of the last look among them, which would end this look early).
            consumer.unsubscribe()
            consumer.assign(partitions)
            for tp in partitions:
                committed = consumer.committed(tp, timeout_ms=timeout_ms)
                consumer.seek(tp, max(starts[tp], committed or 0))
            return _first_records(consumer, partitions, per_partition, deadline)
        except LagUnavailable:
            self._drop()
            raise
        except (KafkaError, KeyError, TimeoutError, AssertionError) as exc:
            self._drop()
            raise LagUnavailable(
                f"records of group {group!r} on {topic!r}: {type(exc).__name__}: {exc}"
            ) from exc

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            consumer.close(autocommit=False)
