"""The Kafka side of the job pipeline: topics, and producing with acks from all replicas.

Topics: the jobs topic (keyed by job id), a retry topic (messages carry ``not_before``;
the worker forwards them back when due) and a dead-letter topic for jobs that kept failing.
kafka-python is synchronous; the gateway calls it from a thread.
"""

from __future__ import annotations

import contextlib
import logging
import threading

from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from tiergate.queue.schema import JobMessage
from tiergate.settings import KafkaSettings

log = logging.getLogger("tiergate.pipeline")


class QueueUnavailable(Exception):
    """The broker did not acknowledge in time."""


class JobQueue:
    """Produces job messages; the producer is created on first use, so that a gateway can
    start (and serve completions) while Kafka is away."""

    def __init__(self, settings: KafkaSettings) -> None:
        self._settings = settings
        self._producer: KafkaProducer | None = None
        self._lock = threading.Lock()

    def ensure_topics(self) -> None:
        try:
            admin = KafkaAdminClient(
                bootstrap_servers=self._settings.bootstrap_servers,
                request_timeout_ms=int(self._settings.request_timeout_seconds * 1000),
                bootstrap_timeout_ms=int(self._settings.request_timeout_seconds * 1000),
            )
        except KafkaError as exc:
            raise QueueUnavailable(str(exc)) from exc
        try:
            existing = set(admin.list_topics())
            wanted = [
                NewTopic(name, self._settings.partitions, 1)
                for name in (
                    self._settings.topic,
                    self._settings.retry_topic,
                    self._settings.dead_letter_topic,
                )
                if name not in existing
            ]
            if wanted:
                with contextlib.suppress(TopicAlreadyExistsError):
                    admin.create_topics(wanted)
        finally:
            admin.close()

    def _get_producer(self) -> KafkaProducer:
        with self._lock:
            if self._producer is None:
                try:
                    self._producer = KafkaProducer(
                        bootstrap_servers=self._settings.bootstrap_servers,
                        acks="all",
                        enable_idempotence=True,
                        linger_ms=0,
                        max_block_ms=int(self._settings.request_timeout_seconds * 1000),
                        request_timeout_ms=int(self._settings.request_timeout_seconds * 1000),
                        bootstrap_timeout_ms=int(self._settings.request_timeout_seconds * 1000),
                    )
                except KafkaError as exc:
                    raise QueueUnavailable(str(exc)) from exc
            return self._producer

    def _send(self, topic: str, message: JobMessage) -> None:
        try:
            future = self._get_producer().send(
                topic, key=message.id.encode(), value=message.model_dump_json().encode()
            )
            future.get(timeout=self._settings.request_timeout_seconds)
        except (KafkaError, TimeoutError) as exc:
            raise QueueUnavailable(f"{topic}: {type(exc).__name__}: {exc}") from exc

    def enqueue(self, message: JobMessage) -> None:
        self._send(self._settings.topic, message)

    def retry_later(self, message: JobMessage) -> None:
        self._send(self._settings.retry_topic, message)

    def dead_letter(self, message: JobMessage) -> None:
        self._send(self._settings.dead_letter_topic, message)

    def close(self) -> None:
        with self._lock:
            if self._producer is not None:
                self._producer.close(timeout=5)
                self._producer = None
