"""What a job worker tells Prometheus and its liveness probe.

No module-level state: every metric lives in the :class:`WorkerMetrics` instance's own
registry, every heartbeat in a :class:`Liveness` instance; the worker owns both and
serves them with :class:`tiergate.jobs.run.observe_http.WorkerHTTP`.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tiergate.protocol import TERMINAL_STATUSES

SANDBOX_PHASES = frozenset({"setup", "command", "verifier"})
# Reasons are free short codes ("ok", "sandbox", "model_refused", "transient_failures",
# "crashed_workers", "invalid_job", "internal", "cancelled", "max_steps", "timeout", ...)
# but never free text: each distinct value is a time series.
_REASON = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
# Series that exist from the start, so that rate() sees their first increase (the chart's
# TiergateJobsFailingInSandbox alert reads failed/sandbox).
_INITIAL_OUTCOMES = (("completed", "ok"), ("failed", "sandbox"))

# Environment names come from job specs: at most this many get series of their own, later
# ones share the label "_other" (each distinct value is a time series).
MAX_ENVIRONMENT_LABELS = 100
BREAKER_STATES = {"closed": 0.0, "half_open": 1.0, "open": 2.0}

_STEP_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)
_SANDBOX_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


class WorkerMetrics:
    """A worker's metrics; ``registry`` is what ``/metrics`` exposes."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.queue_lag = Gauge(
            "tiergate_jobs_queue_lag",
            "Messages waiting: log end offset minus the consumer group's committed offset",
            ["topic", "partition"],
            registry=r,
        )
        self.running_jobs = Gauge("tiergate_jobs_running", "Jobs running now", registry=r)
        self.finished_total = Counter(
            "tiergate_jobs_finished_total",
            "Jobs that reached a terminal status, by status and reason",
            ["status", "reason"],
            registry=r,
        )
        self.step_seconds = Histogram(
            "tiergate_jobs_step_seconds",
            "One agent step: the model call and the command",
            buckets=_STEP_BUCKETS,
            registry=r,
        )
        self.sandbox_seconds = Histogram(
            "tiergate_jobs_sandbox_seconds",
            "Time in the sandbox, by phase",
            ["phase"],
            buckets=_SANDBOX_BUCKETS,
            registry=r,
        )
        self.retries_total = Counter(
            "tiergate_jobs_retries_total", "Jobs sent to the retry topic", registry=r
        )
        self.dead_lettered_total = Counter(
            "tiergate_jobs_dead_lettered_total", "Jobs sent to the dead-letter topic", registry=r
        )
        self.thread_alive = Gauge(
            "tiergate_worker_thread_alive",
            "1 while the worker thread is alive and its heartbeat is fresh",
            ["thread"],
            registry=r,
        )
        self.breaker_state_gauge = Gauge(
            "tiergate_environment_breaker_state",
            "An environment's circuit breaker as this worker last saw it: "
            "0 closed, 1 half-open, 2 open",
            ["environment"],
            registry=r,
        )
        self.breaker_transitions_total = Counter(
            "tiergate_environment_breaker_transitions_total",
            "Breaker state changes this process made, by the state entered",
            ["environment", "to"],
            registry=r,
        )
        self.infra_failures_total = Counter(
            "tiergate_environment_infra_failures_total",
            "Infrastructure failures of jobs (setup, sandbox_start, verifier) by environment",
            ["environment", "stage"],
            registry=r,
        )
        self.failed_fast_total = Counter(
            "tiergate_environment_jobs_failed_fast_total",
            "Jobs ended at once because their environment's breaker was open",
            ["environment"],
            registry=r,
        )
        self._environments: set[str] = set()
        self._env_lock = threading.Lock()
        for status, reason in _INITIAL_OUTCOMES:
            self.finished_total.labels(status=status, reason=reason)

    def set_lag(self, topic: str, partition: int, lag: int) -> None:
        self.queue_lag.labels(topic=topic, partition=str(partition)).set(max(0, lag))

    def set_lags(self, topic: str, lags: dict[int, int]) -> None:
        """Every partition's lag, as :func:`tiergate.queue.lag.measure_lag` returns them."""
        for partition, lag in lags.items():
            self.set_lag(topic, partition, lag)

    def running(self) -> AbstractContextManager[Any]:
        """``with metrics.running(): ...`` counts one running job for the block."""
        return self.running_jobs.track_inprogress()

    def finished(self, status: str, reason: str) -> None:
        """One job reached ``status`` (a JobStatus value) for ``reason`` (a short code)."""
        status = str(getattr(status, "value", status))
        if status not in TERMINAL_STATUSES:
            raise ValueError(f"not a terminal job status: {status!r}")
        if not _REASON.match(reason):
            raise ValueError(f"reason must be a short code like 'sandbox', not {reason!r}")
        self.finished_total.labels(status=status, reason=reason).inc()

    def step(self) -> AbstractContextManager[Any]:
        """``with metrics.step(): ...`` times one agent step."""
        return self.step_seconds.time()

    def observe_step(self, seconds: float) -> None:
        self.step_seconds.observe(seconds)

    def sandbox(self, phase: str) -> AbstractContextManager[Any]:
        """``with metrics.sandbox("command"): ...`` times one sandbox phase."""
        return self._phase(phase).time()

    def observe_sandbox(self, phase: str, seconds: float) -> None:
        self._phase(phase).observe(seconds)

    def _phase(self, phase: str) -> Histogram:
        if phase not in SANDBOX_PHASES:
            raise ValueError(f"sandbox phase must be one of {sorted(SANDBOX_PHASES)}: {phase!r}")
        return self.sandbox_seconds.labels(phase=phase)

    def retried(self) -> None:
        self.retries_total.inc()

    def dead_lettered(self) -> None:
        self.dead_lettered_total.inc()

    def _environment(self, name: str) -> str:
        with self._env_lock:
            if name in self._environments:
                return name
            if len(self._environments) >= MAX_ENVIRONMENT_LABELS:
                return "_other"
            self._environments.add(name)
            return name

    def breaker_state(self, environment: str, state: str) -> None:
        self.breaker_state_gauge.labels(environment=self._environment(environment)).set(
            BREAKER_STATES[state]
        )

    def breaker_transition(self, environment: str, to: str) -> None:
        if to not in BREAKER_STATES:
            raise ValueError(f"not a breaker state: {to!r}")
        self.breaker_transitions_total.labels(
            environment=self._environment(environment), to=to
        ).inc()

    def infra_failure(self, environment: str, stage: str) -> None:
        self.infra_failures_total.labels(
            environment=self._environment(environment), stage=stage
        ).inc()

    def failed_fast(self, environment: str) -> None:
        self.failed_fast_total.labels(environment=self._environment(environment)).inc()

    def observe_liveness(self, liveness: Liveness) -> None:
        """Copy each registered thread's state into ``tiergate_worker_thread_alive``."""
        _, threads = liveness.healthy()
        for name, state in threads.items():
            self.thread_alive.labels(thread=name).set(1.0 if state["ok"] else 0.0)


@dataclass
class _Entry:
    thread: threading.Thread
    stale_after: float
    last_beat: float
    busy: int = 0


class Liveness:
    """Named threads and their heartbeats. A thread is unhealthy when it is no longer alive
    while the worker is not stopping, or when it is not busy and its last heartbeat is older
    than its staleness (``math.inf``: never stale). While busy (a job may run for hours)
    only its being alive counts."""

    def __init__(
        self, stale_after: float = 60.0, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if stale_after <= 0:
            raise ValueError("stale_after must be positive")
        self._default_stale = stale_after
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self._stopping = False

    def register(
        self, name: str, thread: threading.Thread | None = None, *, stale_after: float | None = None
    ) -> None:
        """Watch ``thread`` (default: the calling thread) under ``name``; counts as a beat.
        A thread registered before it starts is fine: it is "starting" until then."""
        stale = self._default_stale if stale_after is None else stale_after
        with self._lock:
            self._entries[name] = _Entry(thread or threading.current_thread(), stale, self._clock())

    def unregister(self, name: str) -> None:
        with self._lock:
            self._entries.pop(name, None)

    def beat(self, name: str) -> None:
        with self._lock:
            self._entries[name].last_beat = self._clock()

    @contextmanager
    def busy(self, name: str) -> Iterator[None]:
        """The thread is working (a job): staleness is not judged until the block ends."""
        with self._lock:
            self._entries[name].busy += 1
        try:
            yield
        finally:
            with self._lock:
                entry = self._entries.get(name)
                if entry is not None:
                    entry.busy -= 1
                    entry.last_beat = self._clock()

    def stopping(self) -> None:
        """The worker is draining: threads that end are no longer a failure."""
        with self._lock:
            self._stopping = True

    def healthy(self) -> tuple[bool, dict[str, dict[str, Any]]]:
        """``(ok, {name: {"ok", "state", "heartbeat_age_seconds"}})``; state is one of
        starting, ok, busy, stale, dead or stopped."""
        now = self._clock()
        threads: dict[str, dict[str, Any]] = {}
        with self._lock:
            for name, entry in self._entries.items():
                age = max(0.0, now - entry.last_beat)
                if entry.thread.ident is None:
                    state = "starting"
                elif not entry.thread.is_alive():
                    state = "stopped" if self._stopping else "dead"
                elif entry.busy:
                    state = "busy"
                elif age > entry.stale_after and not self._stopping:
                    state = "stale"
                else:
                    state = "ok"
                ok = state not in ("dead", "stale")
                threads[name] = {"ok": ok, "state": state, "heartbeat_age_seconds": round(age, 3)}
        return all(t["ok"] for t in threads.values()), threads
