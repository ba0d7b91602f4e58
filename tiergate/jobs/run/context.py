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


class EnvironmentNotFound(Exception):
    """The job names an environment that is not registered."""


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
        # The environment's circuit breaker (tiergate.jobs.state.breaker), shared by all workers
        # through the store; _run leaves what the job said about its environment here.
        self.breakers = breakers or BreakerBoard(store, settings, self.metrics)
        self.verdict: tuple[FailureKind, str] = ("neutral", "")
        self.registry = Registry(store.objects)
        self.envs = EnvCache(Path(settings.sandbox.cache_dir), self.registry)
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
        """Tell the breaker what the job said about its environment; a failure to do so
        does not change the job's ending (a lost probe verdict is taken over, see
        tiergate.jobs.state.breaker)."""
        verdict, detail = self.verdict
        try:
            self.breakers.record(environment, job_id, verdict, detail, owner=owner)
        except StorageError as exc:
            log.warning("job %s: breaker of %s not updated: %s", job_id, environment, exc)

    def environment_root(self, name: str, entry: Registered | None) -> Path | None:
        """The root the job runs in: a registered name's unpacked root (its digest was
        recorded on the job when it started); "default" unregistered: None, the worker's
        own system."""
        if entry is None:
            if name == "default":
                return None
            raise EnvironmentNotFound(
                f"no environment {name!r} is registered (tiergate env build, tiergate env list)"
            )
        return self.fetch_environment(entry.digest)

    def fetch_environment(self, digest: str) -> Path:
        try:
            return self.envs.get(digest)
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
