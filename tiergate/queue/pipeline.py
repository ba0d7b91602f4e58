"""The Kafka side of the job pipeline: topics, and producing with acks from all replicas.

Topics: the jobs topic (keyed by job id), a retry topic (messages carry ``not_before``;
the worker forwards them back when due) and a dead-letter topic for jobs that kept failing.
kafka-python is synchronous; the gateway calls it from a thread.

A message's size has one owner, ``jobs.kafka.max_request_size``: the producer is configured
with it, and the gateway checks a job against it (:meth:`JobQueue.check_size`) before
anything is written, so that a spec too large for the queue is the caller's 413 rather
than a 503 on every try. A size refusal (the producer's own, or the broker's) is never
retried and never resets the shared producer: nothing is wrong with the connection.
"""

from __future__ import annotations

import contextlib
import logging
import threading

from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import (
    KafkaError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    TopicAlreadyExistsError,
)
from kafka.record.default_records import DefaultRecordBatchBuilder

from tiergate.jobsettings import KafkaSettings
from tiergate.protocol import JobMessage
from tiergate.protocol.openaibatch import ChunkMessage

log = logging.getLogger("tiergate.pipeline")


class QueueUnavailable(Exception):
    """The broker did not acknowledge in time. ``maybe_delivered``: a send had handed the
    message to the producer, which may still get it to the broker (a slow or frozen one);
    False only when no attempt got that far (the broker unreachable)."""

    maybe_delivered: bool = False


class MessageTooLarge(QueueUnavailable):
    """A job's message is over the queue's size limit: no retry can help. A subclass of
    :class:`QueueUnavailable` so that a caller that only knows that one (the worker's
    retry and dead-letter sends) still handles it; the gateway answers it with 413."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"the job's message is {size} bytes, over the queue's limit of {limit} bytes"
        )
        self.size = size
        self.limit = limit


_SIZE_ERRORS = (MessageSizeTooLargeError, RecordListTooLargeError)


def message_size(message: JobMessage | ChunkMessage) -> int:
    """The size the producer counts against ``max_request_size`` for ``message`` (the
    record batch kafka-python estimates for its key and value)."""
    size: int = DefaultRecordBatchBuilder.estimate_size_in_bytes(
        message.id.encode(), message.model_dump_json().encode(), []
    )
    return size


class JobQueue:
    """Produces job messages; the producer is created on first use, so that a gateway can
    start (and serve completions) while Kafka is away."""

    def __init__(self, settings: KafkaSettings) -> None:
        self._settings = settings
        self._producer: KafkaProducer | None = None
        self._lock = threading.Lock()
        self._ensured: set[str] = set()

    def ensure_topics(self) -> None:
        try:
            admin = KafkaAdminClient(
                **self._settings.client_options(),
                request_timeout_ms=int(self._settings.request_timeout_seconds * 1000),
                bootstrap_timeout_ms=int(self._settings.request_timeout_seconds * 1000),
            )
        except KafkaError as exc:
            raise QueueUnavailable(f"the broker is unreachable ({type(exc).__name__})") from exc
        try:
            existing = set(admin.list_topics())
            wanted = [
                NewTopic(name, self._settings.partitions, self._settings.replication_factor)
                for name in (
                    self._settings.topic,
                    self._settings.retry_topic,
                    self._settings.dead_letter_topic,
                    self._settings.batch_topic,
                )
                if name not in existing
            ]
            if wanted:
                with contextlib.suppress(TopicAlreadyExistsError):
                    admin.create_topics(wanted)
        except KafkaError as exc:
            raise QueueUnavailable(f"the broker failed ({type(exc).__name__})") from exc
        finally:
            admin.close()

    def _get_producer(self) -> KafkaProducer:
        with self._lock:
            if self._producer is None:
                try:
                    self._producer = KafkaProducer(
                        **self._settings.client_options(),
                        acks="all",
                        enable_idempotence=True,
                        max_request_size=self._settings.max_request_size,
                        linger_ms=0,
                        max_block_ms=int(self._settings.request_timeout_seconds * 1000),
                        request_timeout_ms=int(self._settings.request_timeout_seconds * 1000),
                        bootstrap_timeout_ms=int(self._settings.request_timeout_seconds * 1000),
                    )
                except KafkaError as exc:
                    raise QueueUnavailable(
                        f"the broker is unreachable ({type(exc).__name__})"
                    ) from exc
            return self._producer

    def _reset_producer(self) -> None:
        with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            with contextlib.suppress(Exception):
                producer.close(timeout=1)

    def check_size(self, message: JobMessage | ChunkMessage) -> None:
        """Raise :class:`MessageTooLarge` when ``message`` is over the producer's limit."""
        size = message_size(message)
        if size > self._settings.max_request_size:
            raise MessageTooLarge(size, self._settings.max_request_size)

    def _send(self, topic: str, message: JobMessage | ChunkMessage) -> None:
        """Produce and wait for the broker's acknowledgement (``acks=all``): an answer here
        means the message is in the broker's storage. A first failure (a broker that
        restarted, topics that vanished with an in-memory broker) gets one more try on a
        new producer after the topics are ensured; the second is the caller's 503. A
        message over the size limit is :class:`MessageTooLarge` at once, the producer kept."""
        self.check_size(message)
        handed = False
        for attempt in (1, 2):
            try:
                if topic not in self._ensured:
                    self.ensure_topics()
                    self._ensured.add(topic)
                future = self._get_producer().send(
                    topic, key=message.id.encode(), value=message.model_dump_json().encode()
                )
                handed = True
                future.get(timeout=self._settings.request_timeout_seconds)
                return
            except _SIZE_ERRORS as exc:
                # The broker's own limit may be lower than the producer's: still the
                # message's fault, not the connection's.
                log.warning("produce to %s refused the message's size: %r", topic, exc)
                raise MessageTooLarge(
                    message_size(message), self._settings.max_request_size
                ) from exc
            except (KafkaError, TimeoutError, QueueUnavailable) as exc:
                log.warning("produce to %s failed (attempt %d): %r", topic, attempt, exc)
                self._ensured.clear()
                self._reset_producer()
                if attempt == 2:
                    failed = QueueUnavailable(
                        f"the broker did not acknowledge ({type(exc).__name__})"
                    )
                    failed.maybe_delivered = handed
                    raise failed from exc

    def enqueue(self, message: JobMessage) -> None:
        self._send(self._settings.topic, message)

    def retry_later(self, message: JobMessage) -> None:
        self._send(self._settings.retry_topic, message)

    def send_chunk(self, message: ChunkMessage) -> None:
        """One chunk of an OpenAI batch's lines (tiergate.jobs.lines), acknowledged."""
        self._send(self._settings.batch_topic, message)

    def dead_letter(self, message: JobMessage) -> None:
        self._send(self._settings.dead_letter_topic, message)

    def close(self) -> None:
        with self._lock:
            if self._producer is not None:
                self._producer.close(timeout=5)
                self._producer = None
