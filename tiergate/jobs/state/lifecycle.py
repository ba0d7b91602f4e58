"""The one owner of a job's lifecycle: every state change and every event of a job goes
through here, from the gateway (create, cancel) and from the worker (start, step, retry,
finish) alike.

Rules it keeps:
- a job's terminal record (``result.json``) is written once; the first writer wins and
  every later attempt to end the job is a no-op that returns the winner;
- every event gets the next free sequence number, each written once (If-None-Match), so
  two writers (a gateway cancelling while a worker steps) never overwrite each other;
- a terminal event follows a terminal record; a job whose writer died between the two gets
  it from :meth:`ensure_terminal_event` on its next delivery; however many writers end a
  job, its stream has one terminal event (``JobStore.append_event_once``);
- one job's writes land in the order they are made: the worker's ``start`` may write in the
  background (``wait=False``, while the job's first command spawns: nothing a caller is
  promised depends on seeing "in_progress" before the command runs), and every later
  change of that job waits for those writes first (:meth:`settle`);
- a worker's writes of a job are fenced by its run's lease (:meth:`fence`,
  tiergate.jobs.state.lease): each checks the lease first, and a run taken over by another
  raises :class:`~tiergate.jobs.state.lease.Fenced` instead of writing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from tiergate.jobs.state.store import JobStore, StorageError
from tiergate.protocol import CommandEntry, Job, JobCreate, JobMessage, JobResult, JobStatus

log = logging.getLogger("tiergate.jobs")


def _now_ms() -> int:
    return int(time.time() * 1000)


class JobLifecycle:
    def __init__(self, store: JobStore) -> None:
        self._store = store
        self._sequence: dict[str, int] = {}  # the last event number this process wrote
        self._pending: dict[str, Future[None]] = {}  # a job's writes still in flight
        self._writer: ThreadPoolExecutor | None = None
        self._fences: dict[str, Callable[[], None]] = {}  # job id -> its lease's check

    def fence(self, job_id: str, check: Callable[[], None] | None) -> None:
        """Make every later write of ``job_id`` through here call ``check`` first (a
        run's :meth:`~tiergate.jobs.state.lease.RunLease.check`); None lifts it."""
        if check is None:
            self._fences.pop(job_id, None)
        else:
            self._fences[job_id] = check

    def _guard(self, job_id: str) -> None:
        check = self._fences.get(job_id)
        if check is not None:
            check()

    def _emit(self, job_id: str, kind: str, *, once: bool = False, **data: Any) -> None:
        """``once``: the job's terminal event, which another writer may be writing too."""
        event = {"type": kind, "created_at": int(time.time()), **data}
        hint = self._sequence.get(job_id)
        if once:
            # From this process's own last event, the ender's (no terminal event can
            # precede it); else from the start, for one may be anywhere.
            hint = self._store.append_event_once(job_id, event, after=hint or 0)
        else:
            if hint is None:
                hint = self._store.last_sequence(job_id)
            hint = self._store.append_event(job_id, event, after=hint)
        self._sequence[job_id] = hint

    def forget(self, job_id: str) -> None:
        self._sequence.pop(job_id, None)

    def settle(self, job_id: str, quiet: bool = False) -> None:
        """Wait for the job's writes still in flight; their failure is raised (``quiet``:
        logged: the caller is ending the job anyway, and its own writes follow)."""
        pending = self._pending.pop(job_id, None)
        if pending is None:
            return
        try:
            pending.result()
        except StorageError as exc:
            if not quiet:
                raise
            log.warning("job %s: its start was not recorded: %s", job_id, exc)

    # -- the gateway's side -----------------------------------------------------------------

    def new_job(self, job_id: str, owner: str, spec: JobCreate) -> Job:
        now = _now_ms()
        return Job(
            id=job_id,
            owner=owner,
            status=JobStatus.QUEUED,
            model=spec.model,
            service_tier=spec.service_tier,
            created_at=now // 1000,
            created_ms=now,
            metadata=spec.metadata,
            environment=spec.environment,
        )

    def create(self, job: Job, spec: JobCreate) -> bool:
        """Record an accepted job (before its message is produced); False when a job with
        its id is recorded already (then the caller must not enqueue it)."""
        if not self._store.create(job, spec):
            return False
        self._emit(job.id, "job.queued", status="queued")
        self.forget(job.id)  # the gateway keeps nothing per job it accepted
        return True

    def discard(self, job: Job) -> None:
        """The job's message never reached the broker: it was never accepted."""
        self._store.delete(job)
        self.forget(job.id)

    def cancel(self, job: Job) -> Job:
        """Ask a job to stop. A queued job ends now; a running one when its worker sees the
        request (within ``cancel_poll_seconds``). Idempotent; a finished job is returned
        as it is."""
        if job.status.terminal:
            return job
        self._store.request_cancel(job.id)
        if job.status is JobStatus.QUEUED:
            return self.finish(job, JobStatus.CANCELLED)
        job.cancel_requested_at = int(time.time())
        self._store.put_status(job)
        stored = self._store.get(job.id)
        if stored is None:
            return job
        # The worker's write of its own copy (a step) may land between ours and this read,
        # and the record is the last writer's: the request stands all the same (its marker,
        # which the worker polls), so the answer says it was made. Seen in a loaded CI run:
        # the cancel's answer had no cancel_requested_at, and the job was cancelled.
        if not stored.status.terminal and stored.cancel_requested_at is None:
            stored.cancel_requested_at = job.cancel_requested_at
        return stored

    # -- the worker's side ------------------------------------------------------------------

    def start(
        self,
        message: JobMessage,
        deliveries: int,
        environment_digest: str | None = None,
        current: Job | None = None,
        last_sequence: int | None = None,
        wait: bool = True,
        run: int | None = None,
    ) -> Job:
        """In progress; ``environment_digest``: the environment it runs in (tiergate.envs);
        ``current``: the job's record as the caller just read it (saves reading it again
        before the first command), else it is read here; ``last_sequence``: the job's last
        event number as the caller just listed it; ``wait=False``: the writes go on in the
        background, and the job's next change waits for them (:meth:`settle`)."""
        job = (
            current
            or self._store.get(message.id)
            or self.new_job(message.id, message.owner, message.spec)
        )
        job.environment_digest = environment_digest
        job.status = JobStatus.IN_PROGRESS
        job.started_at = int(time.time())
        job.attempts = deliveries
        job.run = run
        job.error = None
        if last_sequence is not None:
            self._sequence.setdefault(job.id, last_sequence)
        self.settle(job.id, quiet=True)
        snapshot = job.model_copy(deep=True)  # the caller goes on changing ``job``
        if wait:
            self._write_start(snapshot, deliveries)
        else:
            if self._writer is None:
                self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lifecycle")
            self._pending[job.id] = self._writer.submit(self._write_start, snapshot, deliveries)
        return job

    def _write_start(self, job: Job, deliveries: int) -> None:
        self._guard(job.id)
        self._store.mark_running(job.owner, job.id)
        self._store.put_status(job)
        self._emit(
            job.id, "job.in_progress", status=job.status.value, attempt=deliveries, run=job.run
        )

    def ran_in(self, job: Job, digest: str) -> None:
        """Record the digest of the environment a replay runs in (its original's)."""
        self.settle(job.id)
        self._guard(job.id)
        job.environment_digest = digest
        self._store.put_status(job)

    def step(self, job: Job, entry: CommandEntry) -> None:
        self.settle(job.id)
        self._guard(job.id)
        job.steps = entry["step"]
        self._store.put_status(job)
        self._emit(
            job.id,
            "job.step",
            step=entry["step"],
            command=entry["command"],
            exit_code=entry["exit_code"],
            output=entry["output"],
            run=job.run,
        )

    def verified(self, job: Job, result: JobResult) -> None:
        self.settle(job.id)
        self._guard(job.id)
        job.result = result
        self._emit(
            job.id,
            "job.verified",
            exit_code=result.verifier_exit_code,
            reward=result.reward,
            run=job.run,
        )

    def retrying(self, job: Job, attempt: int, delay: float, error: str) -> None:
        self.settle(job.id, quiet=True)
        self._guard(job.id)
        job.status = JobStatus.QUEUED
        # "attempt": the one that failed. A copy of its message delivered again (a worker
        # that took the job over from a busy one's partition, a redelivery after a
        # rebalance) is stale and skipped; the retry is the message of attempt + 1.
        job.error = {"code": "retrying", "message": error, "attempt": attempt}
        self._store.put_status(job)
        self._store.unmark_running(job.owner, job.id)
        self._emit(
            job.id,
            "job.retrying",
            attempt=attempt,
            delay_seconds=delay,
            error=error,
            run=job.run,
        )

    def waiting(self, job: Job, reason: str) -> None:
        """Queued past its key's share of the fleet (tiergate.jobs.state.share): the record
        says why, and the job's event stream says so once."""
        already = (job.error or {}).get("code") == "fleet_share"
        job.error = {"code": "fleet_share", "message": reason}
        self._store.put_status(job)
        if not already:
            self._emit(job.id, "job.waiting", reason=reason)

    def finish(
        self,
        job: Job,
        status: JobStatus,
        *,
        error: dict[str, Any] | None = None,
        incomplete: str | None = None,
    ) -> Job:
        """End the job once; returns the job as finally recorded (another writer's, if it
        got there first)."""
        self.settle(job.id, quiet=True)
        self._guard(job.id)
        job.status = status
        job.completed_at = int(time.time())
        if error is not None:
            job.error = error
        if incomplete is not None:
            job.incomplete_details = {"reason": incomplete}
        if job.id not in self._sequence:  # listed before the record: no terminal event yet
            self._sequence[job.id] = self._store.last_sequence(job.id)
        if not self._store.finalize(job):
            log.info("job %s: already finished by another writer", job.id)
            self.forget(job.id)
            return self._store.final(job.id) or job
        self._emit(
            job.id,
            f"job.{status.value}",
            once=True,
            status=status.value,
            job=job.model_dump(mode="json", exclude={"owner", "created_ms"}),
        )
        self.forget(job.id)
        return job

    def ensure_terminal_event(self, final: Job) -> None:
        """Write the ended job's terminal event unless it is there, or lands meanwhile
        from the writer that ended the job (:meth:`JobStore.append_event_once`)."""
        self.forget(final.id)  # looked for from the stream's start
        self._emit(
            final.id,
            f"job.{final.status.value}",
            once=True,
            status=final.status.value,
            job=final.model_dump(mode="json", exclude={"owner", "created_ms"}),
        )
        self.forget(final.id)
