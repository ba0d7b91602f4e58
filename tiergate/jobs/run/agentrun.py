"""An agent job's run: the workspace (upload, files), the setup commands, the agent loop
against the model, the verifier on a copy of the workspace, the artifacts, and how the run
ended, with what it says about its environment left on the slot's
:class:`~tiergate.jobs.run.context.RunContext` for the breaker. Pickup, leases and failures
are :class:`tiergate.jobs.run.runner.JobRunner`'s."""

from __future__ import annotations

import time

from tiergate.envs.registry import Registered
from tiergate.jobs.run.agent import AgentLoop
from tiergate.jobs.run.context import Outcome, RunContext
from tiergate.jobs.run.jobsandbox import (
    CancelWatch,
    read_rewards,
    unpack_upload,
    verifier_verdict,
)
from tiergate.protocol import CommandEntry, Job, JobMessage, JobResult, JobStatus, TrajectoryEntry
from tiergate.sandbox import SandboxError


class AgentRunner:
    """Runs an agent job in a slot (its :class:`RunContext`)."""

    def __init__(self, ctx: RunContext) -> None:
        self._ctx = ctx

    def run(self, job: Job, message: JobMessage, entry: Registered | None = None) -> Outcome:
        ctx = self._ctx
        spec = message.spec
        deadline = time.monotonic() + spec.limits.timeout_seconds
        disk = spec.limits.disk_mb * 1024 * 1024
        root = ctx.environment_root(spec.environment, entry)
        try:
            sandbox = ctx.early.take(job.id, spec.limits, root)
        except SandboxError as exc:
            ctx.verdict = ("sandbox_start", str(exc))
            raise
        ctx.sandbox = sandbox
        watch = CancelWatch(
            ctx.store, job.id, sandbox, ctx.settings.worker.cancel_poll_seconds
        ).start()
        cancelled = watch.cancelled
        trajectory: list[TrajectoryEntry] = []
        model = ctx.model_client(message)
        try:
            if spec.workspace.upload_id and not unpack_upload(
                ctx.store, message.owner, spec.workspace.upload_id, sandbox, disk
            ):
                raise SandboxError("the workspace upload no longer exists")
            sandbox.write_files(spec.workspace.files or {})
            sandbox.check_disk(disk)
            for command in spec.setup:
                with ctx.metrics.sandbox("setup"):
                    result = sandbox.run(command, timeout=max(1.0, deadline - time.monotonic()))
                trajectory.append(
                    {
                        "type": "setup",
                        "command": command,
                        "exit_code": result.exit_code,
                        "output": result.output,
                    }
                )
                ctx.check_abandon()
                sandbox.check_disk(disk)
                if result.exit_code != 0:
                    ctx.verdict = ("setup", f"exit {result.exit_code}: {command[:100]}")
                    raise SandboxError(f"setup command failed ({result.exit_code}): {command}")

            mark = [time.monotonic()]

            def on_step(entry: CommandEntry) -> None:
                ctx.metrics.observe_sandbox("command", float(entry["seconds"]))
                ctx.metrics.observe_step(time.monotonic() - mark[0])
                mark[0] = time.monotonic()
                ctx.jobs.step(job, entry)
                sandbox.check_disk(disk)

            run = AgentLoop(
                model=model,
                sandbox=sandbox,
                instruction=spec.instruction,
                max_steps=spec.limits.max_steps,
                deadline=deadline,
                protocol=ctx.settings.worker.protocol,
                cancelled=cancelled.is_set,
                on_step=on_step,
            ).run()
            trajectory += run.trajectory
            job.steps = run.steps
            ctx.check_abandon()
            if run.stop == "cancelled" or cancelled.is_set():
                ctx.store_artifacts(job, sandbox, trajectory, None)
                ctx.end(job, JobStatus.CANCELLED, "cancelled")
                return "finished"
            verifier_log = None
            if spec.verifier is not None:
                # On a copy of the agent's workspace without its reward file, with the
                # workspace off Python's import path (see tiergate.sandbox.sandbox); the
                # artifact keeps the agent's workspace.
                sandbox.prepare_verifier(spec.verifier.reward_file)
                with ctx.metrics.sandbox("verifier"):
                    result = sandbox.run(
                        spec.verifier.command, spec.verifier.timeout_seconds, verifier=True
                    )
                verifier_log = result.output
                ctx.verdict = verifier_verdict(
                    result.exit_code, result.timed_out, cancelled.is_set()
                )
                sandbox.check_disk(disk, verifier=True)
                reward, rewards = read_rewards(
                    sandbox.verifier_workspace, spec.verifier.reward_file
                )
                ctx.jobs.verified(
                    job,
                    JobResult(
                        passed=result.exit_code == 0 and (reward is None or reward > 0),
                        reward=reward,
                        rewards=rewards,
                        verifier_exit_code=result.exit_code,
                    ),
                )
            ctx.check_abandon()
            ctx.store_artifacts(job, sandbox, trajectory, verifier_log)
            if run.stop in ("max_steps", "timeout"):
                ctx.end(job, JobStatus.INCOMPLETE, run.stop, incomplete=run.stop)
            else:
                if ctx.verdict[0] == "neutral":
                    ctx.verdict = ("ok", "")
                ctx.end(job, JobStatus.COMPLETED, "ok")
            return "finished"
        finally:
            ctx.first_spawn = sandbox.first_spawn
            watch.stop()
            model.close()
            sandbox.close()
            ctx.sandbox = None
