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
from tiergate.jobs.run.agent import AgentLoop, ModelRefused, ModelUnavailable
from tiergate.jobs.run.jobsandbox import (
    CancelWatch,
    read_reward,
    unpack_upload,
    verifier_verdict,
)
from tiergate.jobs.run.pickup import Pickup, read_pickup
from tiergate.jobs.run.replayrun import ReplayRunning
from tiergate.jobs.run.runbase import (
    ENDED,
    Abandoned,
    EnvironmentNotFound,
    Outcome,
)
from tiergate.jobs.state import joberrors
from tiergate.jobs.state.lease import Fenced, Held, RunLease
from tiergate.jobs.state.store import StorageError
from tiergate.protocol import CommandEntry, Job, JobMessage, JobResult, JobStatus, TrajectoryEntry
from tiergate.queue.pipeline import QueueUnavailable
from tiergate.sandbox import SandboxError

log = logging.getLogger("tiergate.worker")

__all__ = ["Abandoned", "EnvironmentNotFound", "JobRunner", "Outcome"]


class JobRunner(ReplayRunning):
    """Runs jobs for one worker slot; ``abandon()`` may be called from another thread."""

    def process(self, message: JobMessage, early: bool = True) -> Outcome:
        """Pick the job up and run it; ``early=False``: a message tried again (its run was
        held elsewhere), whose sandbox is not made ahead of knowing it is to run."""
        self.picked_up, self.first_spawn = time.time(), None
        if early:
            self._early.make(message)
        try:
            return self._pickup(message)
        except Fenced as exc:
            log.warning("%s: it stops here and writes nothing more", exc)
            return "fenced"
        finally:
            self._early.drop()

    def _pickup(self, message: JobMessage) -> Outcome:
        reads = read_pickup(self._store, self._registry, self._breakers, message)
        final, current = reads.final, reads.current
        if final is not None:
            # A worker may have died between the terminal record and its event: the event
            # stream must still end, so the event is written now.
            self._jobs.ensure_terminal_event(final)
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
        why = self._share.admit(message.owner, message.id)
        if why is not None and current.status is JobStatus.QUEUED:
            return self._wait_for_share(current, message, why)
        try:
            taken = self._leases.take(message.id, self._holder)
            if isinstance(taken, Held):
                log.info(
                    "job %s: run %d is held by a live lease elsewhere", message.id, taken.epoch
                )
                return "held"
            return self._leased_run(message, reads, taken)
        finally:
            self._share.ended(message.owner, message.id)

    def _leased_run(self, message: JobMessage, reads: Pickup, taken: RunLease) -> Outcome:
        taken.on_fenced = self._fenced
        self._lease = taken
        self._jobs.fence(message.id, taken.check)
        outcome: Outcome = "fenced"
        try:
            outcome = self._leased(message, reads, taken)
            return outcome
        finally:
            self._jobs.fence(message.id, None)
            self._lease = None
            if outcome not in ENDED:
                taken.release()
            self._leases.done(taken)

    def _leased(self, message: JobMessage, reads: Pickup, lease: RunLease) -> Outcome:
        environment = message.spec.environment
        current = reads.current
        if current is not None and reads.cancel_requested.result():
            self._end(current, JobStatus.CANCELLED, "cancelled")
            return "finished"
        admission = self._breakers.admit(environment, message.id, reads.breaker)
        if not admission.allowed:
            # Before a pickup is counted or a sandbox made: nothing of the job runs. It is
            # dead-lettered like other failures, so it can be sent again once it works.
            job = current or self._jobs.new_job(message.id, message.owner, message.spec)
            self._metrics.failed_fast(environment)
            self._end(
                job,
                JobStatus.FAILED,
                "environment_unavailable",
                error={"code": "environment_unavailable", "message": admission.message},
            )
            self._dead_letter(message)
            return "dead"
        deliveries = self._store.record_delivery(message.id, reads.deliveries)
        max_attempts = self._settings.worker.max_attempts
        if deliveries > max_attempts:
            job = current or self._jobs.new_job(message.id, message.owner, message.spec)
            self._end(
                job,
                JobStatus.FAILED,
                "crashed_workers",
                error={
                    "code": "crashed_workers",
                    "message": f"picked up {deliveries - 1} times without finishing "
                    f"(max_attempts={max_attempts}): the job stops the worker that runs it",
                },
            )
            self._dead_letter(message)
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
        job = self._jobs.start(
            message,
            deliveries,
            environment_digest=digest,
            current=current or self._jobs.new_job(message.id, message.owner, message.spec),
            last_sequence=reads.last_event,
            wait=False,
            run=lease.epoch,
        )
        self._verdict = ("neutral", "")
        abandoned = False
        try:
            if isinstance(lookup, Exception):
                raise lookup
            return self._run(job, message, lookup)
        except Fenced:
            abandoned = True  # the run that took over judges the environment
            raise
        except Abandoned:
            abandoned = True  # it runs again (the probe too, if it was one): no verdict
            self._store.forget_delivery(message.id, deliveries)
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
            self._end(
                job, JobStatus.FAILED, reason, error={"code": reason, "message": message_text}
            )
            self._dead_letter(message)
            return "dead"
        finally:
            self._jobs.settle(message.id, quiet=True)
            if not abandoned:
                self._judge(environment, message.id, message.owner)

    def _run(self, job: Job, message: JobMessage, entry: Registered | None = None) -> Outcome:
        if job.replay_of or message.replay_of:
            self._early.drop()  # a replay's sandbox has the same name: made afresh
            return self._replay(job, message)
        spec = message.spec
        deadline = time.monotonic() + spec.limits.timeout_seconds
        disk = spec.limits.disk_mb * 1024 * 1024
        root = self._environment(spec.environment, entry)
        try:
            sandbox = self._early.take(job.id, spec.limits, root)
        except SandboxError as exc:
            self._verdict = ("sandbox_start", str(exc))
            raise
        self._sandbox = sandbox
        watch = CancelWatch(
            self._store, job.id, sandbox, self._settings.worker.cancel_poll_seconds
        ).start()
        cancelled = watch.cancelled
        trajectory: list[TrajectoryEntry] = []
        model = self._model_client(message)
        try:
            if spec.workspace.upload_id and not unpack_upload(
                self._store, message.owner, spec.workspace.upload_id, sandbox, disk
            ):
                raise SandboxError("the workspace upload no longer exists")
            sandbox.write_files(spec.workspace.files or {})
            sandbox.check_disk(disk)
            for command in spec.setup:
                with self._metrics.sandbox("setup"):
                    result = sandbox.run(command, timeout=max(1.0, deadline - time.monotonic()))
                trajectory.append(
                    {
                        "type": "setup",
                        "command": command,
                        "exit_code": result.exit_code,
                        "output": result.output,
                    }
                )
                self._check_abandon()
                sandbox.check_disk(disk)
                if result.exit_code != 0:
                    self._verdict = ("setup", f"exit {result.exit_code}: {command[:100]}")
                    raise SandboxError(f"setup command failed ({result.exit_code}): {command}")

            mark = [time.monotonic()]

            def on_step(entry: CommandEntry) -> None:
                self._metrics.observe_sandbox("command", float(entry["seconds"]))
                self._metrics.observe_step(time.monotonic() - mark[0])
                mark[0] = time.monotonic()
                self._jobs.step(job, entry)
                sandbox.check_disk(disk)

            run = AgentLoop(
                model=model,
                sandbox=sandbox,
                instruction=spec.instruction,
                max_steps=spec.limits.max_steps,
                deadline=deadline,
                protocol=self._settings.worker.protocol,
                cancelled=cancelled.is_set,
                on_step=on_step,
            ).run()
            trajectory += run.trajectory
            job.steps = run.steps
            self._check_abandon()
            if run.stop == "cancelled" or cancelled.is_set():
                self._store_artifacts(job, sandbox, trajectory, None)
                self._end(job, JobStatus.CANCELLED, "cancelled")
                return "finished"
            verifier_log = None
            if spec.verifier is not None:
                # On a copy of the agent's workspace without its reward file, with the
                # workspace off Python's import path (see tiergate.sandbox.sandbox); the
                # artifact keeps the agent's workspace.
                sandbox.prepare_verifier(spec.verifier.reward_file)
                with self._metrics.sandbox("verifier"):
                    result = sandbox.run(
                        spec.verifier.command, spec.verifier.timeout_seconds, verifier=True
                    )
                verifier_log = result.output
                self._verdict = verifier_verdict(
                    result.exit_code, result.timed_out, cancelled.is_set()
                )
                sandbox.check_disk(disk, verifier=True)
                reward = read_reward(sandbox.verifier_workspace, spec.verifier.reward_file)
                self._jobs.verified(
                    job,
                    JobResult(
                        passed=result.exit_code == 0 and (reward is None or reward > 0),
                        reward=reward,
                        verifier_exit_code=result.exit_code,
                    ),
                )
            self._check_abandon()
            self._store_artifacts(job, sandbox, trajectory, verifier_log)
            if run.stop in ("max_steps", "timeout"):
                self._end(job, JobStatus.INCOMPLETE, run.stop, incomplete=run.stop)
            else:
                if self._verdict[0] == "neutral":
                    self._verdict = ("ok", "")
                self._end(job, JobStatus.COMPLETED, "ok")
            return "finished"
        finally:
            self.first_spawn = sandbox.first_spawn
            watch.stop()
            model.close()
            sandbox.close()
            self._sandbox = None

    def _wait_for_share(self, job: Job, message: JobMessage, why: str) -> Outcome:
        """Its key holds its share of the fleet while others wait: back in the queue
        through the retry topic (no attempt counted), the reason on its record."""
        delay = self._settings.fleet_share_retry_seconds
        self._queue.retry_later(message.model_copy(update={"not_before": time.time() + delay}))
        self._jobs.waiting(job, why)
        log.info("job %s: %s", message.id, why)
        return "waiting"

    # -- failure ----------------------------------------------------------------------------

    def _transient(self, job: Job, message: JobMessage, exc: Exception) -> Outcome:
        if self._lease is not None:
            self._lease.check()  # a fenced run schedules no retry
        worker = self._settings.worker
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
                self._queue.retry_later(retry)
                self._jobs.retrying(job, message.attempt, delay, said)
                return "retry"
            except (QueueUnavailable, StorageError) as again:
                log.error("job %s could not be scheduled for retry: %s", job.id, again)
                raise
        self._end(
            job,
            JobStatus.FAILED,
            "transient_failures",
            error={
                "code": "transient_failures",
                "message": f"gave up after {message.attempt} attempts: {said}",
            },
        )
        self._dead_letter(message)
        return "dead"


def _stale(message: JobMessage, current: Job) -> bool:
    """A message of an attempt that already failed, while the job waits for its retry."""
    error = current.error or {}
    return (
        current.status is JobStatus.QUEUED
        and error.get("code") == "retrying"
        and message.attempt <= int(error.get("attempt", 0))
    )
