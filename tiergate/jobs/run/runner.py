"""Running one job, start to finish: workspace, setup, the agent loop, the verifier, the
artifacts. Every state change goes through :class:`JobLifecycle`.

What ends a job, and how:
- the agent stops, runs out of steps or time: ``completed`` or ``incomplete``;
- a transient failure (model endpoint down, object storage errors): the retry topic with
  backoff, ``failed`` after ``max_attempts``;
- anything else that goes wrong while processing (the sandbox, a refused model call, a
  bad archive, a bug): ``failed`` with the reason, and the message to the dead-letter
  topic; the partition moves on;
- a job whose pickups keep killing their worker: every pickup is counted in object
  storage, so after ``max_attempts`` pickups it is failed without running again.
- a job whose environment's circuit breaker is open (tiergate.jobs.state.breaker): ``failed``
  with ``environment_unavailable`` at once, before a sandbox is made; what every other job
  says about its environment (worked, an infrastructure failure, nothing) goes to the
  breaker when it ends.
- a job naming an environment (tiergate.envs) that is not registered: ``failed`` with
  ``environment_not_found`` (the job's mistake, not the environment's: no breaker verdict);
  fetching or unpacking a registered one failing is an infrastructure failure (the breaker
  hears ``sandbox_start``; a storage error is retried like any other).
Redelivery is normal: a job whose terminal record exists is not run again. A pickup
takes the job's run lease first (tiergate.jobs.state.lease): a job whose run is held by a live
lease elsewhere is ``held`` (nothing written; the worker tries it again later), and a run
taken over by another pickup is ``fenced``: its sandbox is killed and it writes nothing.
"""

from __future__ import annotations

import logging
import time

from tiergate.envs.registry import Registered
from tiergate.jobs.run.agent import ModelRefused, ModelUnavailable
from tiergate.jobs.run.agentrun import AgentRunner
from tiergate.jobs.run.context import (
    ENDED,
    Abandoned,
    Outcome,
    RunContext,
)
from tiergate.jobs.run.environments import EnvironmentNotFound
from tiergate.jobs.run.pickup import Pickup, read_pickup
from tiergate.jobs.run.replayrun import ReplayRunner
from tiergate.jobs.state import joberrors
from tiergate.jobs.state.lease import Fenced, Held, RunLease
from tiergate.jobs.state.store import StorageError
from tiergate.protocol import Job, JobMessage, JobStatus
from tiergate.queue.pipeline import QueueUnavailable
from tiergate.sandbox import SandboxError

log = logging.getLogger("tiergate.worker")

__all__ = ["Abandoned", "EnvironmentNotFound", "JobRunner", "Outcome"]


class JobRunner:
    """Runs jobs for one worker slot; ``abandon()`` may be called from another thread.
    Composed: the slot's :class:`RunContext` (collaborators, the run in progress), an
    :class:`AgentRunner` and a :class:`ReplayRunner` on it; this class picks jobs up, holds
    their run leases and decides how failures end them."""

    def __init__(self, ctx: RunContext) -> None:
        self._ctx = ctx
        self._agent = AgentRunner(self._ctx)
        self._replay = ReplayRunner(self._ctx)

    @property
    def picked_up(self) -> float:
        """Wall-clock time the last job's message was picked up (tiergate bench sandbox)."""
        return self._ctx.picked_up

    @property
    def first_spawn(self) -> float | None:
        """Wall-clock time the last job's first command spawned (None: none ran)."""
        return self._ctx.first_spawn

    def abandon(self) -> None:
        self._ctx.abandon()

    def process(self, message: JobMessage, early: bool = True) -> Outcome:
        """Pick the job up and run it; ``early=False``: a message tried again (its run was
        held elsewhere), whose sandbox is not made ahead of knowing it is to run."""
        self._ctx.picked_up, self._ctx.first_spawn = time.time(), None
        if early:
            self._ctx.early.make(message)
        try:
            return self._pickup(message)
        except Fenced as exc:
            log.warning("%s: it stops here and writes nothing more", exc)
            return "fenced"
        finally:
            self._ctx.early.drop()

    def _pickup(self, message: JobMessage) -> Outcome:
        reads = read_pickup(self._ctx.store, self._ctx.environments, message)
        final, current = reads.final, reads.current
        if final is not None:
            # A worker may have died between the terminal record and its event: the event
            # stream must still end, so the event is written now.
            self._ctx.jobs.ensure_terminal_event(final)
            log.info("job %s already finished; redelivery skipped", message.id)
            return "skipped"
        if current is None or current.owner != message.owner or reads.spec != message.spec:
            # Nothing a message says is trusted without its record: no record (a create
            # that never finished, or a job deleted), or one whose owner or spec differs
            # (a message no gateway wrote), and it is dropped, run for no one.
            log.warning("job %s: its message does not match a recorded job; dropped", message.id)
            return "skipped"
        if message.resent and current.status is not JobStatus.QUEUED:
            return "skipped"  # the original message got through after all
        if _stale(message, current):
            log.info(
                "job %s: attempt %d failed already and is retried; its copy skipped",
                message.id,
                message.attempt,
            )
            return "skipped"
        why = self._ctx.share.admit(message.owner, message.id)
        if why is not None and current.status is JobStatus.QUEUED:
            return self._wait_for_share(current, message, why)
        try:
            taken = self._ctx.leases.take(message.id, self._ctx.holder)
            if isinstance(taken, Held):
                log.info(
                    "job %s: run %d is held by a live lease elsewhere", message.id, taken.epoch
                )
                return "held"
            return self._leased_run(message, reads, taken)
        finally:
            self._ctx.share.ended(message.owner, message.id)

    def _leased_run(self, message: JobMessage, reads: Pickup, taken: RunLease) -> Outcome:
        taken.on_fenced = self._ctx.fenced
        self._ctx.lease = taken
        self._ctx.jobs.fence(message.id, taken.check)
        outcome: Outcome = "fenced"
        try:
            outcome = self._leased(message, reads, taken)
            return outcome
        finally:
            self._ctx.jobs.fence(message.id, None)
            self._ctx.lease = None
            if outcome not in ENDED:
                taken.release()
            self._ctx.leases.done(taken)

    def _leased(self, message: JobMessage, reads: Pickup, lease: RunLease) -> Outcome:
        environment = message.spec.environment
        current = reads.current
        if current is not None and reads.cancel_requested.result():
            self._ctx.end(current, JobStatus.CANCELLED, "cancelled")
            return "finished"
        admission = self._ctx.environments.admit(environment, message.id, reads.breaker)
        if not admission.allowed:
            # Before a pickup is counted or a sandbox made: nothing of the job runs. It is
            # dead-lettered like other failures, so it can be sent again once it works.
            job = current or self._ctx.jobs.new_job(message.id, message.owner, message.spec)
            self._ctx.metrics.failed_fast(environment)
            self._ctx.end(
                job,
                JobStatus.FAILED,
                "environment_unavailable",
                error={"code": "environment_unavailable", "message": admission.message},
            )
            self._ctx.dead_letter(message)
            return "dead"
        deliveries = self._ctx.store.record_delivery(message.id, reads.deliveries)
        max_attempts = self._ctx.settings.worker.max_attempts
        if deliveries > max_attempts:
            job = current or self._ctx.jobs.new_job(message.id, message.owner, message.spec)
            self._ctx.end(
                job,
                JobStatus.FAILED,
                "crashed_workers",
                error={
                    "code": "crashed_workers",
                    "message": f"picked up {deliveries - 1} times without finishing "
                    f"(max_attempts={max_attempts}): the job stops the worker that runs it",
                },
            )
            self._ctx.dead_letter(message)
            return "dead"
        # The environment's name is resolved before the job is marked in progress, so that
        # its digest goes in that same write; a failure to resolve it is raised below, where
        # the job's failures are handled.
        lookup: Registered | Exception | None = None
        if reads.environment is not None and not (current is not None and current.replay_of):
            try:
                lookup = reads.environment.result()
            except StorageError as exc:
                lookup = exc
        digest = lookup.digest if isinstance(lookup, Registered) else None
        # Marked in progress in the background, while the sandbox is made and the first
        # command spawns; the job's next write waits for it (JobLifecycle.settle).
        job = self._ctx.jobs.start(
            message,
            deliveries,
            environment_digest=digest,
            current=current or self._ctx.jobs.new_job(message.id, message.owner, message.spec),
            last_sequence=reads.last_event,
            wait=False,
            run=lease.epoch,
        )
        self._ctx.verdict = ("neutral", "")
        abandoned = False
        try:
            if isinstance(lookup, Exception):
                raise lookup
            if job.replay_of or message.replay_of:
                self._ctx.early.drop()  # a replay's sandbox has the same name: made afresh
                return self._replay.run(job, message)
            return self._agent.run(job, message, lookup)
        except Fenced:
            abandoned = True  # the run that took over judges the environment
            raise
        except Abandoned:
            abandoned = True  # it runs again (the probe too, if it was one): no verdict
            self._ctx.store.forget_delivery(message.id, deliveries)
            return "abandoned"
        except (ModelUnavailable, StorageError) as exc:
            return self._transient(job, message, exc)
        except Exception as exc:
            reason = (
                "sandbox"
                if isinstance(exc, SandboxError)
                else "model_refused"
                if isinstance(exc, ModelRefused)
                else "environment_not_found"
                if isinstance(exc, EnvironmentNotFound)
                else "internal"
            )
            if reason == "internal":
                message_text = joberrors.internal(job.id, exc)
            else:
                log.info("job %s failed (%s): %s", job.id, reason, exc)
                message_text = joberrors.scrub(str(exc))
            self._ctx.end(
                job, JobStatus.FAILED, reason, error={"code": reason, "message": message_text}
            )
            self._ctx.dead_letter(message)
            return "dead"
        finally:
            self._ctx.jobs.settle(message.id, quiet=True)
            if not abandoned:
                self._ctx.judge(environment, message.id, message.owner)

    def _wait_for_share(self, job: Job, message: JobMessage, why: str) -> Outcome:
        """Its key holds its share of the fleet while others wait: back in the queue
        through the retry topic (no attempt counted), the reason on its record."""
        delay = self._ctx.settings.fleet_share_retry_seconds
        self._ctx.queue.retry_later(message.model_copy(update={"not_before": time.time() + delay}))
        self._ctx.jobs.waiting(job, why)
        log.info("job %s: %s", message.id, why)
        return "waiting"

    # -- failure ----------------------------------------------------------------------------

    def _transient(self, job: Job, message: JobMessage, exc: Exception) -> Outcome:
        if self._ctx.lease is not None:
            self._ctx.lease.check()  # a fenced run schedules no retry
        worker = self._ctx.settings.worker
        log.warning("job %s attempt %d failed: %s", job.id, message.attempt, exc)
        if isinstance(exc, ModelUnavailable):
            said = f"the model endpoint was unavailable ({joberrors.scrub(str(exc))})"
        else:
            said = joberrors.transient(job.id, exc, "object storage")
        if message.attempt < worker.max_attempts:
            delay = worker.retry_backoff_seconds * 2 ** (message.attempt - 1)
            retry = message.model_copy(
                update={"attempt": message.attempt + 1, "not_before": time.time() + delay}
            )
            try:
                self._ctx.queue.retry_later(retry)
                self._ctx.jobs.retrying(job, message.attempt, delay, said)
                return "retry"
            except (QueueUnavailable, StorageError) as again:
                log.error("job %s could not be scheduled for retry: %s", job.id, again)
                raise
        self._ctx.end(
            job,
            JobStatus.FAILED,
            "transient_failures",
            error={
                "code": "transient_failures",
                "message": f"gave up after {message.attempt} attempts: {said}",
            },
        )
        self._ctx.dead_letter(message)
        return "dead"


def _stale(message: JobMessage, current: Job) -> bool:
    """A message of an attempt that already failed, while the job waits for its retry."""
    error = current.error or {}
    return (
        current.status is JobStatus.QUEUED
        and error.get("code") == "retrying"
        and message.attempt <= int(error.get("attempt", 0))
    )
