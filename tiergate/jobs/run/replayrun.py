"""Running a replay job (see tiergate.jobs.run.replay): the original's recorded commands
again, without the model, in the environment digest the original ran in."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from tiergate.jobs.run.context import Outcome, RunContext
from tiergate.jobs.run.jobsandbox import (
    CancelWatch,
)
from tiergate.jobs.run.replay import (
    Replay,
    ReplayPlan,
    ReplayRefused,
    plan_replay,
    prepare_workspace,
)
from tiergate.jobs.state import joberrors
from tiergate.protocol import CommandEntry, Job, JobMessage, JobStatus
from tiergate.sandbox import Sandbox

log = logging.getLogger("tiergate.worker")


class ReplayRunner:
    """A replay job's run, for :class:`tiergate.jobs.run.runner.JobRunner`."""

    def __init__(self, ctx: RunContext) -> None:
        self._ctx = ctx

    def run(self, job: Job, message: JobMessage) -> Outcome:
        """Run the original's recorded commands again; the report goes in ``job.replay``
        (and so in the terminal record, the ``result`` artifact), the replayed trajectory,
        verifier log and workspace are the replay's own artifacts. A replay that cannot run
        fails with its reason (not dead-lettered: running it again would not help)."""
        original_id = job.replay_of or message.replay_of
        assert original_id is not None
        job.kind, job.replay_of = "replay", original_id
        try:
            plan = plan_replay(
                self._ctx.store,
                self._ctx.environments,
                original_id,
                message.owner,
                message.spec,
            )
        except ReplayRefused as exc:
            self._ctx.end(
                job,
                JobStatus.FAILED,
                exc.code,
                error={"code": exc.code, "message": joberrors.scrub(str(exc))},
            )
            return "finished"
        root = None if plan.digest is None else self._ctx.fetch_environment(plan.digest)
        if plan.digest is not None:
            self._ctx.jobs.ran_in(job, plan.digest)
        return self._run_replay(job, message, plan, root)

    def _run_replay(
        self, job: Job, message: JobMessage, plan: ReplayPlan, root: Path | None
    ) -> Outcome:
        spec = plan.spec
        disk = spec.limits.disk_mb * 1024 * 1024
        sandbox = Sandbox(
            self._ctx.early.name(job.id), spec.limits, self._ctx.settings.sandbox, root=root
        )
        self._ctx.sandbox = sandbox
        watch = CancelWatch(
            self._ctx.store, job.id, sandbox, self._ctx.settings.worker.cancel_poll_seconds
        ).start()
        cancelled = watch.cancelled

        def on_step(entry: CommandEntry) -> None:
            self._ctx.metrics.observe_sandbox("command", float(entry["seconds"]))
            self._ctx.jobs.step(job, entry)
            self._ctx.check_abandon()

        try:
            prepare_workspace(self._ctx.store, message.owner, spec, sandbox, disk)
            run = Replay(
                sandbox=sandbox,
                spec=spec,
                original=plan.original,
                recorded=plan.recorded,
                recorded_verifier_log=plan.verifier_log,
                environment=plan.environment,
                deadline=time.monotonic() + spec.limits.timeout_seconds,
                disk=disk,
                cancelled=cancelled.is_set,
                on_step=on_step,
            ).run()
            self._ctx.check_abandon()
            job.steps = len(run.report.steps)
            job.replay = run.report
            self._ctx.store_artifacts(job, sandbox, run.trajectory, run.verifier_log)
            if run.cancelled or cancelled.is_set():
                self._ctx.end(job, JobStatus.CANCELLED, "cancelled")
                return "finished"
            if run.result is not None:
                self._ctx.jobs.verified(job, run.result)
            self._ctx.end(job, JobStatus.COMPLETED, "ok")
            return "finished"
        finally:
            watch.stop()
            sandbox.close()
            self._ctx.sandbox = None
