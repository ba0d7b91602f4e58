"""``tiergate worker``: consumer-group members that run jobs, at most ``concurrency`` at once.

Each slot is a consumer of its own in the group, taking one message at a time and
committing its offset only after the job's outcome is stored (so a crash means the job is
redelivered, never lost). kafka-python heartbeats from a thread, so a long job keeps its
membership; ``max_poll_interval_ms`` is sized to the longest job. SIGTERM stops taking new
jobs and waits up to ``drain_seconds`` for running ones; a job still running then is
abandoned without commit and will run again elsewhere.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable

from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata
from pydantic import ValidationError

from tiergate.queue.agent import ModelClient
from tiergate.queue.pipeline import JobQueue
from tiergate.queue.runner import JobRunner
from tiergate.queue.schema import JobMessage
from tiergate.queue.store import JobStore
from tiergate.settings import JobsSettings

log = logging.getLogger("tiergate.worker")

# The longest job (6 h limit, plus its verifier) must not look like a stuck consumer.
MAX_POLL_INTERVAL_MS = (6 * 3600 + 3600 + 600) * 1000


class Worker:
    def __init__(
        self,
        settings: JobsSettings,
        *,
        model_client: Callable[[JobMessage], ModelClient] | None = None,
    ) -> None:
        self._settings = settings
        self._store = JobStore(settings.storage)
        self._queue = JobQueue(settings.kafka)
        self._model_client = model_client
        self._stopping = threading.Event()
        self._runners: list[JobRunner] = []
        self._threads: list[threading.Thread] = []
        self.processed: list[tuple[str, str]] = []  # (job id, outcome), for tests and logs

    def _consumer(self, topic: str, group: str) -> KafkaConsumer:
        kafka = self._settings.kafka
        return KafkaConsumer(
            topic,
            bootstrap_servers=kafka.bootstrap_servers,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=1,
            session_timeout_ms=kafka.session_timeout_ms,
            heartbeat_interval_ms=max(300, kafka.session_timeout_ms // 3),
            max_poll_interval_ms=MAX_POLL_INTERVAL_MS,
            fetch_max_wait_ms=100,
        )

    def start(self) -> None:
        self._store.ensure_bucket()
        self._queue.ensure_topics()
        for index in range(self._settings.worker.concurrency):
            runner = JobRunner(self._settings, self._store, self._queue, self._model_client)
            self._runners.append(runner)
            thread = threading.Thread(
                target=self._slot, args=(runner,), name=f"job-slot-{index}", daemon=True
            )
            self._threads.append(thread)
        self._threads.append(
            threading.Thread(target=self._forward_retries, name="retries", daemon=True)
        )
        for thread in self._threads:
            thread.start()

    def stop(self, drain_seconds: float | None = None) -> None:
        """Stop taking jobs; wait for running ones up to the drain, then abandon them."""
        drain = self._settings.worker.drain_seconds if drain_seconds is None else drain_seconds
        self._stopping.set()
        deadline = time.monotonic() + drain
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for runner in self._runners:
            runner.abandon()
        for thread in self._threads:
            thread.join(10)
        self._queue.close()

    def run_forever(self) -> None:
        """The ``tiergate worker`` command: run until SIGTERM or SIGINT, then drain."""
        done = threading.Event()

        def _signal(signum: int, frame: object) -> None:
            log.info(
                "signal %d: draining for up to %.0fs", signum, self._settings.worker.drain_seconds
            )
            done.set()

        signal.signal(signal.SIGTERM, _signal)
        signal.signal(signal.SIGINT, _signal)
        self.start()
        log.info(
            "worker started: %d job slots on %s",
            self._settings.worker.concurrency,
            self._settings.kafka.topic,
        )
        done.wait()
        self.stop()

    # -- slots ------------------------------------------------------------------------------

    def _slot(self, runner: JobRunner) -> None:
        kafka = self._settings.kafka
        consumer = self._consumer(kafka.topic, kafka.group)
        try:
            while not self._stopping.is_set():
                batches = consumer.poll(timeout_ms=500, max_records=1)
                for tp, records in batches.items():
                    for record in records:
                        self._handle(consumer, runner, tp, record.offset, record.value)
        finally:
            consumer.close(autocommit=False)

    def _handle(
        self,
        consumer: KafkaConsumer,
        runner: JobRunner,
        tp: TopicPartition,
        offset: int,
        value: bytes,
    ) -> None:
        try:
            message = JobMessage.model_validate_json(value)
        except ValidationError as exc:
            log.error("unreadable job message at %s:%d dropped: %s", tp, offset, exc)
            consumer.commit({tp: OffsetAndMetadata(offset + 1, "", -1)})
            return
        try:
            outcome = runner.process(message)
        except Exception:
            log.exception("job %s: could not store its outcome; it will run again", message.id)
            time.sleep(min(30.0, self._settings.worker.retry_backoff_seconds))
            consumer.seek(tp, offset)
            return
        self.processed.append((message.id, outcome))
        if outcome == "abandoned":
            return  # not committed: another worker runs it after this one leaves the group
        consumer.commit({tp: OffsetAndMetadata(offset + 1, "", -1)})
        log.info("job %s: %s", message.id, outcome)

    def _forward_retries(self) -> None:
        """Move retry-topic messages back to the jobs topic when they are due."""
        kafka = self._settings.kafka
        consumer = self._consumer(kafka.retry_topic, f"{kafka.group}-retry")
        try:
            while not self._stopping.is_set():
                for tp, records in consumer.poll(timeout_ms=500, max_records=1).items():
                    for record in records:
                        try:
                            message = JobMessage.model_validate_json(record.value)
                        except ValidationError:
                            consumer.commit({tp: OffsetAndMetadata(record.offset + 1, "", -1)})
                            continue
                        wait = message.not_before - time.time()
                        if wait > 0 and self._stopping.wait(wait):
                            consumer.seek(tp, record.offset)
                            return
                        self._queue.enqueue(message)
                        consumer.commit({tp: OffsetAndMetadata(record.offset + 1, "", -1)})
        finally:
            consumer.close(autocommit=False)
