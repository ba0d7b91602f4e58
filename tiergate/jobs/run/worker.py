"""``tiergate worker``: one consumer-group member that runs jobs, at most ``concurrency``
at once.

One consumer thread polls the jobs topic and hands records to the job slots
(tiergate.queue.consumer): it keeps polling while jobs run, pauses its partitions while
every slot is busy, and commits each partition's offsets in order as jobs end, so a crash
redelivers only jobs that had not ended (never lost). A pickup takes the job's run lease
(tiergate.jobs.state.lease), which a keeper thread beats every ``lease_seconds / 3``: a job is
never run twice at once, a run whose worker froze or was cut off is taken over once its
lease expires, and the run taken over writes nothing more. SIGTERM stops taking new jobs
and waits up to ``drain_seconds`` for running ones; a job still running then is abandoned
without commit, its lease released, and runs again elsewhere at once.

A message is never retried in place forever: when the job store or the broker is down the
slot gives the record back to be tried again after a backoff (nothing else could run
either); any other failure ends the job ``failed`` inside the runner, or, if even that
fails, sends the message to the dead-letter topic and moves on.

The worker refuses to start when the sandbox's limits cannot be applied
(:func:`tiergate.sandbox.probe_limits`) unless ``jobs.sandbox.allow_unlimited``. It serves
``/metrics`` and ``/healthz`` (failing when one of its threads died) on ``metrics_port``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from kafka import ConsumerRebalanceListener, KafkaConsumer, TopicPartition
from kafka.errors import InconsistentGroupProtocolError, KafkaError
from kafka.structs import OffsetAndMetadata
from pydantic import ValidationError

from tiergate.jobs.batches.driver import BatchDriver
from tiergate.jobs.batches.metrics import BatchMetrics
from tiergate.jobs.lines.metrics import LineMetrics
from tiergate.jobs.lines.runner import ChunkRunner
from tiergate.jobs.lines.store import LineBatchStore
from tiergate.jobs.lines.sweep import worker_sweeps
from tiergate.jobs.run.agent import ModelClient, ModelUnavailable, WorkerKey
from tiergate.jobs.run.context import RunContext
from tiergate.jobs.run.observe import Liveness, WorkerMetrics
from tiergate.jobs.run.observe_http import WorkerHTTP
from tiergate.jobs.run.runner import JobRunner
from tiergate.jobs.run.steal import Stealer
from tiergate.jobs.state.breaker import BreakerBoard
from tiergate.jobs.state.files import FileStore
from tiergate.jobs.state.lease import Fenced
from tiergate.jobs.state.share import FleetShare
from tiergate.jobs.state.store import JobStore, StorageError
from tiergate.jobsettings import JobsSettings
from tiergate.measure.diskspace import MIB, disk_space
from tiergate.protocol import JobMessage
from tiergate.protocol.openaibatch import ChunkMessage
from tiergate.queue.consumer import Disposition, JobConsumer, Work
from tiergate.queue.lag import LagUnavailable, measure_lag
from tiergate.queue.membership import Membership
from tiergate.queue.pipeline import JobQueue, QueueUnavailable
from tiergate.sandbox import probe_limits

log = logging.getLogger("tiergate.worker")

# Heartbeats this often: a member learns of a rebalance from a heartbeat's answer, so the
# sooner it rejoins, the shorter the pause in pickups (capped at a third of the session).
HEARTBEAT_MS = 500
# The retry forwarder waits for a message's due time between polls (backoffs reach
# minutes); the jobs consumer polls every 200 ms whatever runs, so a minute says it hung.
MAX_POLL_INTERVAL_MS = (6 * 3600 + 3600 + 600) * 1000
JOBS_POLL_INTERVAL_MS = 60_000


class Worker:
    def __init__(
        self,
        settings: JobsSettings,
        *,
        model_client: Callable[[JobMessage], ModelClient] | None = None,
        serve_http: bool = False,
    ) -> None:
        self._settings = settings
        self._store = JobStore(settings.storage)
        self._queue = JobQueue(settings.kafka)
        self._model_client = model_client
        self._stopping = threading.Event()
        self._runners: list[JobRunner] = []
        self._threads: list[threading.Thread] = []
        self.metrics = WorkerMetrics()
        self.line_metrics = LineMetrics(self.metrics.registry)
        self.breakers = BreakerBoard(self._store, settings, self.metrics)
        self.liveness = Liveness(stale_after=settings.worker.heartbeat_stale_seconds)
        self.http = (
            WorkerHTTP(
                self.metrics,
                self.liveness,
                settings.worker.metrics_host,
                settings.worker.metrics_port,
                lambda: {
                    "groups": {g: m.state() for g, m in self.memberships.items()},
                    "disk": self.disk(),
                },
            )
            if serve_http
            else None
        )
        self.limits = ""
        self._disk_low = False  # the sandboxes' disk was short at the last look (disk())
        self.processed: list[tuple[str, str]] = []  # (job id, outcome), for tests and logs
        self.leases = self._store.leases(settings.worker.lease_seconds)
        kafka = settings.kafka
        self.memberships = {
            group: Membership(group, kafka.assignment)
            for group in (kafka.group, f"{kafka.group}-retry", kafka.batch_group)
        }
        self.stealer = (
            Stealer(settings, self._store) if settings.worker.steal_after_seconds > 0 else None
        )
        self.consumer = JobConsumer(
            self._jobs_consumer,
            settings.worker.concurrency,
            self._run_record,
            self._stopping,
            self.liveness.beat,
            self._busy,
            self.stealer.candidates if self.stealer is not None else None,
            settings.worker.steal_after_seconds,
            self.memberships[kafka.group].refused,
        )
        self._drain_until = 0.0

    def _consumer(
        self,
        topic: str,
        group: str,
        max_poll_interval_ms: int = MAX_POLL_INTERVAL_MS,
        listener: ConsumerRebalanceListener | None = None,
    ) -> KafkaConsumer:
        kafka = self._settings.kafka
        consumer = KafkaConsumer(
            **kafka.client_options(),
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=max(1, self._settings.worker.concurrency),
            session_timeout_ms=kafka.session_timeout_ms,
            heartbeat_interval_ms=min(HEARTBEAT_MS, kafka.session_timeout_ms // 3),
            max_poll_interval_ms=max_poll_interval_ms,
            fetch_max_wait_ms=100,
            request_timeout_ms=int(kafka.consumer_request_timeout_seconds * 1000),
            partition_assignment_strategy=self.memberships[group].strategy(),
        )
        consumer.subscribe([topic], listener=listener)
        return consumer

    def _jobs_consumer(self, listener: ConsumerRebalanceListener) -> KafkaConsumer:
        kafka = self._settings.kafka
        return self._consumer(kafka.topic, kafka.group, JOBS_POLL_INTERVAL_MS, listener)

    def _busy(self, name: str) -> contextlib.AbstractContextManager[None]:
        stack = contextlib.ExitStack()
        stack.enter_context(self.liveness.busy(name))
        stack.enter_context(self.metrics.running())
        return stack  # type: ignore[return-value]

    def disk(self) -> dict[str, object]:
        """The sandboxes' disk, for ``/healthz``: what is free and whether it is at least
        ``worker.min_free_mb``. Shown, not failed on: ``/healthz`` is the liveness probe,
        and a restart frees no space but kills the jobs that are running."""
        needed = self._settings.worker.min_free_mb * MIB
        space = disk_space(Path(self._settings.sandbox.work_dir), needed)
        if not space.ok and not self._disk_low:  # said once when it runs low, not per probe
            log.warning("low disk space for sandboxes: %s", space.describe())
        self._disk_low = not space.ok
        return {
            "path": str(space.path),
            "free_mb": space.free // MIB,
            "min_free_mb": self._settings.worker.min_free_mb,
            "ok": space.ok,
        }

    def start(self) -> None:
        # Refuses (LimitsUnavailable) before anything runs, unless limits are waived.
        self.limits = probe_limits(self._settings.sandbox)
        log.info("sandbox limits: %s", self.limits)
        self._store.ensure_bucket()
        self._queue.ensure_topics()
        self.share = FleetShare(
            self._store, self._settings.fleet_share, self._settings.fleet_share_refresh_seconds
        )
        for index in range(self._settings.worker.concurrency):
            # Each slot's jobs run as a user of their own (sandbox.uid + index).
            sandbox = self._settings.sandbox.for_slot(index)
            slot = self._settings.model_copy(update={"sandbox": sandbox})
            ctx = RunContext(
                slot,
                self._store,
                self._queue,
                self._model_client,
                on_finished=self._finished,
                metrics=self.metrics,
                breakers=self.breakers,
                leases=self.leases,
                share=self.share,
            )
            self._runners.append(JobRunner(ctx))
            self._thread(f"job-slot-{index}", self.consumer.slot, index, f"job-slot-{index}")
        self._thread("consumer", self._consume)
        self._thread("lease-keeper", self._keep_leases)
        self._thread("retry-forwarder", self._forward_retries)
        self._thread("batch-scheduler", self._schedule_batches)
        self._thread("openai-batches", self._run_openai_batches)
        self._thread("sweeper", self._sweep)
        if self.http is not None:
            self.http.start()
        for thread in self._threads:
            thread.start()

    def _thread(self, name: str, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads.append(thread)
        self.liveness.register(name, thread)

    def _finished(self, status: str, reason: str) -> None:
        self.metrics.finished(status, reason)
        if status == "failed" and reason != "ok":
            self.metrics.dead_lettered()

    def healthy(self) -> bool:
        return self.liveness.healthy()[0]

    def stop(self, drain_seconds: float | None = None) -> None:
        """Stop taking jobs; wait for running ones up to the drain, then abandon them."""
        drain = self._settings.worker.drain_seconds if drain_seconds is None else drain_seconds
        self._drain_until = time.monotonic() + drain
        self._stopping.set()
        self.liveness.stopping()
        for thread in self._threads:
            thread.join(max(0.0, self._drain_until - time.monotonic()) + 20)
        if self.stealer is not None:
            self.stealer.close()
        self._queue.close()
        if self.http is not None:
            self.http.stop()

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
            "worker started: %d job slots on %s; metrics and health on port %s",
            self._settings.worker.concurrency,
            self._settings.kafka.topic,
            self.http.port if self.http else "-",
        )
        done.wait()
        self.stop()

    # -- slots ------------------------------------------------------------------------------

    def _await_gateway(self, name: str) -> bool:
        """Every job calls the model through the gateway: a slot takes no job while the
        gateway does not answer (a stack still starting, a gateway rollout), so that its
        absence does not burn jobs' attempts. False when the worker is stopping."""
        url = self._settings.gateway_url.rstrip("/") + "/healthz"
        said = False
        while not self._stopping.is_set():
            self.liveness.beat(name)
            try:
                if httpx.get(url, timeout=2.0).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            if not said:
                log.info("%s: waiting for the gateway at %s", name, url)
                said = True
            self._stopping.wait(1.0)
        return False

    def _consume(self) -> None:
        if not self._await_gateway("consumer"):
            return
        self.consumer.run(lambda: self._drain_until, self._abandon_all)

    def _abandon_all(self) -> None:
        for runner in self._runners:
            runner.abandon()

    def _keep_leases(self) -> None:
        """Beat every lease this worker holds, every third of its time to live."""
        name = threading.current_thread().name
        every = self._settings.worker.lease_seconds / 3
        while not self._stopping.wait(every):
            self.liveness.beat(name)
            self.leases.beat_all()
        # Draining: the runs go on until abandoned; keep them alive meanwhile.
        while any(t.is_alive() for t in self._threads if t.name.startswith("job-slot")):
            self.leases.beat_all()
            time.sleep(min(every, 1.0))

    def _commit(self, consumer: KafkaConsumer, tp: TopicPartition, offset: int) -> None:
        try:
            consumer.commit({tp: OffsetAndMetadata(offset + 1, "", -1)})
        except (KafkaError, AssertionError) as exc:
            log.warning("commit of %s:%d failed: %r", tp, offset, exc)

    def _run_record(self, index: int, work: Work) -> Disposition:
        """A slot's record: what the consumer does with its offset afterwards."""
        runner = self._runners[index]
        try:
            message = JobMessage.model_validate_json(work.value)
        except ValidationError as exc:
            log.error("unreadable job message at %s:%d dropped: %s", work.tp, work.offset, exc)
            return ("done", 0.0)
        try:
            outcome = runner.process(message, early=work.tries == 0)
        except (StorageError, QueueUnavailable) as exc:
            # The store or the broker is down: no job could finish now. The same record
            # is tried again after a backoff (its pickup count keeps a crashing job bounded).
            log.warning("job %s: storage or broker unavailable (%s); retrying it", message.id, exc)
            return ("later", max(0.5, self._settings.worker.retry_backoff_seconds))
        except Exception:
            log.exception("job %s: processing failed unexpectedly; dead-lettered", message.id)
            with contextlib.suppress(QueueUnavailable):
                self._queue.dead_letter(message)
            self.metrics.dead_lettered()
            outcome = "dead"
        self.processed.append((message.id, outcome))
        if outcome == "retry":
            self.metrics.retried()
        if outcome == "abandoned":
            return ("open", 0.0)  # not committed: another worker runs it
        if outcome in ("held", "fenced") and work.stolen:
            return ("done", 0.0)  # taken over from another's partition: its owner goes on
        if outcome in ("held", "fenced"):
            # Another run holds the job: look again later (it ends, or its lease expires).
            return ("later", min(10.0, max(0.5, self._settings.worker.lease_seconds / 3)))
        log.info("job %s: %s", message.id, outcome)
        return ("done", 0.0)

    def _forward_retries(self) -> None:
        """Move retry-topic messages back to the jobs topic when they are due."""
        kafka = self._settings.kafka
        name = threading.current_thread().name
        group = f"{kafka.group}-retry"
        consumer = self._consumer(kafka.retry_topic, group)
        try:
            while not self._stopping.is_set():
                self.liveness.beat(name)
                consumer, polled = self._poll_one(consumer, kafka.retry_topic, group)
                for tp, records in polled.items():
                    for record in records:
                        try:
                            message = JobMessage.model_validate_json(record.value)
                        except ValidationError:
                            self._commit(consumer, tp, record.offset)
                            continue
                        wait = message.not_before - time.time()
                        with self.liveness.busy(name):
                            if wait > 0 and self._stopping.wait(wait):
                                consumer.seek(tp, record.offset)
                                return
                        try:
                            self._queue.enqueue(message)
                        except QueueUnavailable as exc:
                            log.warning("retry of %s not forwarded yet: %s", message.id, exc)
                            consumer.seek(tp, record.offset)
                            self._stopping.wait(1.0)
                            continue
                        self._commit(consumer, tp, record.offset)
        finally:
            consumer.close(autocommit=False)

    def _poll_one(
        self, consumer: KafkaConsumer, topic: str, group: str
    ) -> tuple[KafkaConsumer, dict[TopicPartition, list[Any]]]:
        """One record at most from ``consumer``; none while the broker is away or the group
        rebalances (after a pause), and a new consumer when the group refused its
        assignor (tiergate.queue.membership)."""
        try:
            return consumer, consumer.poll(timeout_ms=500, max_records=1)
        except InconsistentGroupProtocolError:
            consumer.close(autocommit=False)
            self.memberships[group].refused()
            return self._consumer(topic, group), {}
        except KafkaError as exc:  # the broker away or the group rebalancing
            log.warning("%s: poll failed: %r", group, exc)
            self._stopping.wait(1.0)
            return consumer, {}

    def _schedule_batches(self) -> None:
        """Rollout batches whose lease this worker holds (tiergate.jobs.batches)."""
        name = threading.current_thread().name
        driver = BatchDriver(
            self._store,
            self._queue,
            self.leases,
            f"{socket.gethostname()}:{os.getpid()}:batches",
            self._settings.max_outstanding_jobs,
            BatchMetrics(self.metrics.registry),
        )
        while not self._stopping.wait(self._settings.batch_poll_seconds):
            self.liveness.beat(name)
            try:
                driver.run_once()
            except (StorageError, QueueUnavailable, Fenced) as exc:
                log.warning("batch scheduling pass skipped: %s", exc)
        driver.release()

    def _run_openai_batches(self) -> None:
        """OpenAI batches' chunks (tiergate.jobs.lines), one at a time, in a group of their
        own, each committed once its answers are written (once): a worker dying mid-chunk
        leaves it to another. One that cannot be written now is sought back."""
        name = threading.current_thread().name
        kafka = self._settings.kafka
        runner = ChunkRunner(
            self._settings.batch_api,
            LineBatchStore(self._store),
            FileStore(self._store),
            self._settings.gateway_url,
            WorkerKey(self._settings.worker.api_key, self._settings.worker.api_key_file).get,
            self._stopping,
            self.line_metrics,
        )
        consumer = self._consumer(kafka.batch_topic, kafka.batch_group)
        try:
            while not self._stopping.is_set():
                self.liveness.beat(name)
                consumer, polled = self._poll_one(consumer, kafka.batch_topic, kafka.batch_group)
                for tp, records in polled.items():
                    for record in records:
                        try:
                            message = ChunkMessage.model_validate_json(record.value)
                        except ValidationError as exc:
                            log.error("unreadable batch chunk at %s dropped: %s", tp, exc)
                            self._commit(consumer, tp, record.offset)
                            continue
                        try:
                            with self.liveness.busy(name):
                                runner.run(message, lambda: self.liveness.beat(name))
                        except (StorageError, InterruptedError, ModelUnavailable) as exc:
                            log.warning("batch chunk %s not answered yet: %s", message.id, exc)
                            consumer.seek(tp, record.offset)
                            self._stopping.wait(1.0)
                            continue
                        except Exception:
                            # A chunk this code cannot run (a bug, never the tenant's lines:
                            # they were checked at creation) must not stop the thread or
                            # come back for ever: its lines are answered as errors.
                            log.exception("batch chunk %s failed; its lines fail", message.id)
                            try:
                                runner.fail(message, "internal_error")
                            except StorageError:
                                consumer.seek(tp, record.offset)
                                continue
                        self._commit(consumer, tp, record.offset)
        finally:
            runner.close()
            consumer.close(autocommit=False)

    def _sweep(self) -> None:
        """Queue lag for the metrics every 15 s; the lost-message sweep every minute."""
        kafka = self._settings.kafka
        name = threading.current_thread().name
        every = min(60.0, self._settings.requeue_after_seconds / 4)
        sweeps = worker_sweeps(self._store, self._queue, self._settings, self.line_metrics)
        last_sweep = 0.0
        while not self._stopping.wait(0 if last_sweep == 0 else min(15.0, every)):
            self.liveness.beat(name)
            with contextlib.suppress(LagUnavailable):
                lags = measure_lag(
                    kafka.bootstrap_servers, kafka.group, kafka.topic, 5.0, kafka.client_options()
                )
                self.metrics.set_lags(kafka.topic, lags)
            self.metrics.observe_liveness(self.liveness)
            try:
                self.breakers.refresh()  # other workers' and operators' changes too
            except StorageError as exc:
                log.warning("breaker states not read: %s", exc)
            if time.monotonic() - last_sweep >= every:
                last_sweep = time.monotonic()
                for sweep in sweeps:
                    try:
                        sweep()
                    except (StorageError, QueueUnavailable, KafkaError, LagUnavailable) as exc:
                        log.warning("sweep skipped: %s", exc)
