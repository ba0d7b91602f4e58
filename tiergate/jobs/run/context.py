"""What every run of a job needs, agent or replay: its collaborators (store, queue,
lifecycle, breakers, leases, environment cache, the sandbox made at pickup), the state of
the run in progress (its sandbox, lease, what it says of its environment), and the small
steps they share (ending the job, telling the breaker, resolving and fetching the
environment, storing artifacts, abandoning).

One :class:`RunContext` per worker slot, handed to the pieces a slot is composed of:
:class:`tiergate.jobs.run.runner.JobRunner` (pickup, lease, failures),
:class:`tiergate.jobs.run.agentrun.AgentRunner` (an agent job's run) and
:class:`tiergate.jobs.run.replayrun.ReplayRunner` (a replay's)."""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from tiergate.envs.cache import EnvCache
from tiergate.envs.registry import Registered, Registry
from tiergate.jobs.run.agent import ModelClient, WorkerKey
from tiergate.jobs.run.environments import JobEnvironments
from tiergate.jobs.run.jobsandbox import (
    EarlySandbox,
    store_artifacts,
)
from tiergate.jobs.run.observe import WorkerMetrics
from tiergate.jobs.state.breaker import BreakerBoard, FailureKind
from tiergate.jobs.state.lease import Leases, RunLease
from tiergate.jobs.state.lifecycle import JobLifecycle
from tiergate.jobs.state.share import FleetShare
from tiergate.jobs.state.store import JobStore, StorageError
from tiergate.jobsettings import JobsSettings
from tiergate.protocol import Job, JobMessage, JobStatus, TrajectoryEntry
from tiergate.queue.pipeline import JobQueue, QueueUnavailable
from tiergate.sandbox import Sandbox, SandboxError

log = logging.getLogger("tiergate.worker")

Outcome = Literal["finished", "skipped", "retry", "dead", "abandoned", "held", "fenced", "waiting"]
# Outcomes after which the job's terminal record exists (its lease needs no release).
ENDED = ("finished", "dead", "skipped")
# Called with (status, reason) when a job ends here, for the worker's metrics.
Finished = Callable[[str, str], None]


class Abandoned(Exception):
    """The worker is shutting down before the job finished; it will be redelivered."""


class RunContext:
    """One slot's collaborators, its run in progress and their shared steps; ``abandon()``
    may be called from another thread."""

    def __init__(
        self,
        settings: JobsSettings,
        store: JobStore,
        queue: JobQueue,
        model_client: Callable[[JobMessage], ModelClient] | None = None,
        on_finished: Finished = lambda status, reason: None,
        metrics: WorkerMetrics | None = None,
        breakers: BreakerBoard | None = None,
        leases: Leases | None = None,
        share: FleetShare | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.queue = queue
        self.jobs = JobLifecycle(store)
        self.model_client = model_client or self._default_client
        self.on_finished = on_finished
        self.metrics = metrics or WorkerMetrics()
        self.abandoned = threading.Event()
        self.sandbox: Sandbox | None = None
        # The environments' registry, unpacked roots and circuit breakers (shared by all
        # workers through the store); a run leaves what it said about its environment in
        # ``verdict`` for the breaker.
        registry = Registry(store.objects)
        self.environments = JobEnvironments(
            registry,
            EnvCache(Path(settings.sandbox.cache_dir), registry),
            breakers or BreakerBoard(store, settings, self.metrics),
        )
        self.verdict: tuple[FailureKind, str] = ("neutral", "")
        # Wall-clock times of the last job: its message picked up, its first command's
        # process spawned (None: none ran) (tiergate bench sandbox).
        self.picked_up = 0.0
        self.first_spawn: float | None = None
        self.early = EarlySandbox(settings.sandbox)
        self.leases = leases or store.leases(settings.worker.lease_seconds)
        # Each key's share of the fleet (one per worker, its slots' runners share it).
        self.share = share or FleetShare(
            store, settings.fleet_share, settings.fleet_share_refresh_seconds
        )
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{settings.sandbox.uid}"
        self.lease: RunLease | None = None
        # jobs.worker.api_key_file (read again when it changes) or jobs.worker.api_key.
        self.worker_key = WorkerKey(settings.worker.api_key, settings.worker.api_key_file)

    def _default_client(self, message: JobMessage) -> ModelClient:
        return ModelClient(
            self.settings.gateway_url,
            message.spec.model,
            message.spec.service_tier,
            self.worker_key,
            on_behalf_of=message.owner,
        )

    def abandon(self) -> None:
        self.abandoned.set()
        if self.sandbox is not None:
            self.sandbox.kill()

    def fenced(self) -> None:
        """Another pickup took this run over (called from the lease keeper's thread)."""
        sandbox = self.sandbox
        if sandbox is not None:
            sandbox.kill()

    def end(self, job: Job, status: JobStatus, reason: str, **kwargs: Any) -> Job:
        final = self.jobs.finish(job, status, **kwargs)
        self.on_finished(final.status.value, reason)
        return final

    # -- the job ----------------------------------------------------------------------------

    def judge(self, environment: str, job_id: str, owner: str) -> None:
        """Tell the environment's breaker what this run said about it."""
        self.environments.judge(environment, job_id, owner, self.verdict)

    def environment_root(self, name: str, entry: Registered | None) -> Path | None:
        """The root the job runs in (tiergate.jobs.run.environments); a failure to fetch or
        unpack it is the environment's (the breaker hears ``sandbox_start``)."""
        try:
            return self.environments.root(name, entry)
        except (SandboxError, StorageError) as exc:
            assert entry is not None  # only a registered entry is fetched
            self.verdict = ("sandbox_start", f"environment {entry.digest[:12]}: {exc}")
            raise

    def fetch_environment(self, digest: str) -> Path:
        """The root unpacked from ``digest`` (a replay's); a failure as in
        :meth:`environment_root`."""
        try:
            return self.environments.fetch(digest)
        except (SandboxError, StorageError) as exc:
            self.verdict = ("sandbox_start", f"environment {digest[:12]}: {exc}")
            raise

    def check_abandon(self) -> None:
        if self.abandoned.is_set():
            raise Abandoned

    def store_artifacts(
        self,
        job: Job,
        sandbox: Sandbox,
        trajectory: list[TrajectoryEntry],
        verifier_log: str | None,
    ) -> None:
        store_artifacts(self.store, job.id, sandbox, trajectory, verifier_log, job.run)

    def dead_letter(self, message: JobMessage) -> None:
        try:
            self.queue.dead_letter(message)
        except QueueUnavailable as exc:
            log.error("job %s: dead-letter topic unavailable: %s", message.id, exc)
