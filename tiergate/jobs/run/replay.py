"""Replay: an earlier job's recorded commands run again, without the model, in a fresh
sandbox, with a report of which steps behaved as recorded.

Where it runs: a replay is a job of its own (``kind: replay``, ``replay_of`` = the original)
made by ``POST /v1/jobs/{id}/replay`` and queued on Kafka like any job, so that a worker,
which has the sandbox, runs it; the gateway never runs sandboxes, and the replay's life
(queued, in progress, steps as events, cancel, the terminal record) goes through
:class:`~tiergate.jobs.state.lifecycle.JobLifecycle` like every job's. ``tiergate jobs replay
ID`` calls that route through the jobs client. Running it in the CLI's own process instead
would need bubblewrap (and the job store's credentials) wherever the CLI runs.

What it does (:class:`Replay`): the original's initial workspace is rebuilt exactly as the
original's worker built it (the same inline files, or the same uploaded archive read under
the owner's prefix: an upload deleted since is a clear ``upload_missing`` failure), the
same setup commands run, then every recorded command in order, then the verifier on a
copy of the workspace as the original's did (:meth:`Sandbox.prepare_verifier`). Each is
compared with the trajectory: the exit status, and the output in the form the sandbox
captured it (a bounded head and tail); durations are recorded beside, never compared.

The environment: the original's environment identity is read from the job (or its spec)
when it has one (``environment``; "default" otherwise) and written in the report. Every
worker can run every environment (it fetches the root by digest), so none refuses a replay
for its environment's name. A job that ran in a built environment (:mod:`tiergate.envs`)
recorded its digest (``environment_digest``): the replay runs in that same digest, fetched
by digest, whatever the name points at now (a blob no longer stored:
``environment_not_found``), and the digest is in the report; a job that ran in the
worker's own system (no digest) is replayed in the worker's own system, even if a
"default" environment was registered since.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tiergate.jobs.run.environments import JobEnvironments, name_of
from tiergate.jobs.run.jobsandbox import read_rewards, unpack_upload
from tiergate.jobs.state.store import JobStore
from tiergate.protocol import (
    CommandEntry,
    Job,
    JobCreate,
    JobResult,
    Pair,
    ReplayedCommand,
    ReplayReport,
    ReplayStep,
    ReplayVerifier,
    TrajectoryEntry,
)
from tiergate.sandbox import Sandbox


class ReplayRefused(Exception):
    """The replay cannot run (the job ends ``failed`` with ``code``)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def read_trajectory(store: JobStore, job_id: str) -> list[dict[str, Any]] | None:
    raw = store.read_artifact(job_id, "trajectory")
    if raw is None:
        return None
    return [json.loads(line) for line in raw.decode().splitlines() if line.strip()]


@dataclass(frozen=True)
class ReplayPlan:
    """What a replay runs: the original as it ended, its spec, trajectory and verifier log,
    the environment's name and the digest it ran in (None: the worker's own system)."""

    original: Job
    spec: JobCreate
    recorded: list[dict[str, Any]]
    verifier_log: str | None
    environment: str
    digest: str | None


def plan_replay(
    store: JobStore,
    environments: JobEnvironments,
    original_id: str,
    owner: str,
    spec: JobCreate,
) -> ReplayPlan:
    """Read and check what a replay of ``original_id`` for ``owner`` runs (``spec``: the
    replay's own, used when the original's is gone): the original's environment digest,
    which every worker can fetch while it is stored; :class:`ReplayRefused` says why it
    cannot run."""
    original = store.final(original_id)
    if original is None or original.owner != owner:
        raise ReplayRefused("original_not_found", f"no finished job {original_id!r}")
    if not original.status.replayable or original.kind == "replay":
        raise ReplayRefused(
            "job_not_replayable", f"job {original_id} ended {original.status.value}"
        )
    recorded = read_trajectory(store, original_id)
    if recorded is None:
        raise ReplayRefused("job_not_replayable", f"job {original_id} recorded no trajectory")
    spec = store.spec(original_id) or spec
    environment = name_of(original, spec)
    digest = original.environment_digest
    if digest is not None and not environments.stored(digest):
        raise ReplayRefused(
            "environment_not_found",
            f"job {original_id} ran in environment digest {digest}, no longer stored",
        )
    log = store.read_artifact(original_id, "verifier_log")
    return ReplayPlan(
        original, spec, recorded, None if log is None else log.decode(), environment, digest
    )


def prepare_workspace(
    store: JobStore, owner: str, spec: JobCreate, sandbox: Sandbox, disk: int
) -> None:
    """The initial workspace, as :meth:`tiergate.jobs.run.agentrun.AgentRunner.run` builds
    it for the original."""
    upload = spec.workspace.upload_id
    if upload and not unpack_upload(store, owner, upload, sandbox, disk):
        raise ReplayRefused(
            "upload_missing",
            f"the original's workspace upload {upload} no longer exists: a replay needs "
            "the same initial workspace",
        )
    sandbox.write_files(spec.workspace.files or {})
    sandbox.check_disk(disk)


def _compare(
    index: int, entry: dict[str, Any], exit_code: int, output: str, seconds: float
) -> ReplayStep:
    exit_matches = entry.get("exit_code") == exit_code
    output_matches = entry.get("output") == output
    return ReplayStep(
        index=index,
        command=entry["command"],
        exit_code=Pair(recorded=entry.get("exit_code"), replayed=exit_code),
        exit_matches=exit_matches,
        output_matches=output_matches,
        seconds=Pair(recorded=entry.get("seconds"), replayed=round(seconds, 3)),
        output=None if output_matches else Pair(recorded=entry.get("output"), replayed=output),
    )


@dataclass
class ReplayRun:
    report: ReplayReport
    trajectory: list[TrajectoryEntry] = field(default_factory=list)
    verifier_log: str | None = None
    result: JobResult | None = None
    cancelled: bool = False


@dataclass
class Replay:
    """Runs an original's recorded commands in ``sandbox`` (whose workspace is already
    prepared) and compares them with the recording."""

    sandbox: Sandbox
    spec: JobCreate
    original: Job
    recorded: list[dict[str, Any]]
    recorded_verifier_log: str | None
    environment: str
    deadline: float
    disk: int
    cancelled: Callable[[], bool] = lambda: False
    on_step: Callable[[CommandEntry], None] = lambda entry: None

    def run(self) -> ReplayRun:
        report = ReplayReport(
            original=self.original.id,
            environment=self.environment,
            environment_digest=self.original.environment_digest,
        )
        run = ReplayRun(report=report)
        setup = [e for e in self.recorded if e.get("type") == "setup"]
        commands = [e for e in self.recorded if e.get("type") == "command"]
        for index, entry in enumerate(setup, start=1):
            result = self._run(entry["command"])
            report.setup.append(
                _compare(index, entry, result.exit_code, result.output, result.seconds)
            )
            run.trajectory.append(
                {
                    "type": "setup",
                    "command": entry["command"],
                    "exit_code": result.exit_code,
                    "output": result.output,
                }
            )
        for entry in commands:
            if self.cancelled():
                run.cancelled = True
                return run
            result = self._run(entry["command"])
            step = _compare(
                int(entry.get("step") or len(report.steps) + 1),
                entry,
                result.exit_code,
                result.output,
                result.seconds,
            )
            report.steps.append(step)
            replayed: ReplayedCommand = {
                "type": "command",
                "step": len(report.steps),
                "command": entry["command"],
                "exit_code": result.exit_code,
                "output": result.output,
                "seconds": round(result.seconds, 3),
                "timed_out": result.timed_out,
                "ts": time.time(),
                "exit_matches": step.exit_matches,
                "output_matches": step.output_matches,
            }
            run.trajectory.append(replayed)
            self.on_step(replayed)
        if self.cancelled():
            run.cancelled = True
            return run
        if self.spec.verifier is not None:
            report.verifier, run.verifier_log, run.result = self._verify()
        every = [*report.setup, *report.steps]
        report.matches = all(s.exit_matches and s.output_matches for s in every) and (
            report.verifier is None or report.verifier.matches
        )
        return run

    def _run(self, command: str) -> Any:
        result = self.sandbox.run(command, timeout=max(1.0, self.deadline - time.monotonic()))
        self.sandbox.check_disk(self.disk)
        return result

    def _verify(self) -> tuple[ReplayVerifier, str, JobResult]:
        verifier = self.spec.verifier
        assert verifier is not None
        self.sandbox.prepare_verifier(verifier.reward_file)
        result = self.sandbox.run(verifier.command, verifier.timeout_seconds, verifier=True)
        self.sandbox.check_disk(self.disk, verifier=True)
        reward, rewards = read_rewards(self.sandbox.verifier_workspace, verifier.reward_file)
        replayed = JobResult(
            passed=result.exit_code == 0 and (reward is None or reward > 0),
            reward=reward,
            rewards=rewards,
            verifier_exit_code=result.exit_code,
        )
        before = self.original.result
        recorded_exit = before.verifier_exit_code if before else None
        exit_matches = recorded_exit == result.exit_code
        output_matches = self.recorded_verifier_log == result.output
        reward_pair = Pair(recorded=before.reward if before else None, replayed=reward)
        passed_pair = Pair(recorded=before.passed if before else None, replayed=replayed.passed)
        report = ReplayVerifier(
            command=verifier.command,
            exit_code=Pair(recorded=recorded_exit, replayed=result.exit_code),
            reward=reward_pair,
            passed=passed_pair,
            exit_matches=exit_matches,
            output_matches=output_matches,
            matches=exit_matches
            and output_matches
            and reward_pair.recorded == reward_pair.replayed
            and passed_pair.recorded == passed_pair.replayed,
        )
        return report, result.output, replayed
