"""What a job's run and a replay's run share around their sandbox: the sandbox made at
pickup, the watch for a cancel request, the artifacts, and how a verifier's exit and
reward file are read."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
from pathlib import Path

from tiergate.jobs.state.breaker import FailureKind
from tiergate.jobs.state.store import JobStore, StorageError
from tiergate.jobsettings import SandboxSettings
from tiergate.protocol import JobLimits, JobMessage, TrajectoryEntry
from tiergate.sandbox import Sandbox, SandboxError

log = logging.getLogger("tiergate.worker")
# The most of a reward file that is read: a number, and room for a line of text after it.
REWARD_MAX_BYTES = 64 * 1024
# Named rewards in one reward file (read_rewards): each is kept in the job's result and in
# every rollout of a batch, so their number and names are small.
MAX_NAMED_REWARDS = 16
_REWARD_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class EarlySandbox:
    """The job's sandbox, made as it is picked up: its first command's process moves into
    the job's cgroup (the kernel's slow part, see tiergate.sandbox.sandbox) while the
    pickup's round trips to the store go on. Not for a replay (its sandbox is made from
    the original's record), a re-sent message, nor a job whose sandbox directory exists:
    another delivery of it may be running or ending in this worker (or in another sharing
    the directory), and making a sandbox takes over its name; such a pickup makes its
    sandbox only once the store says the job is to run, as every pickup did before. One
    runner's, one job at a time: :meth:`make` at pickup, :meth:`take` when the job runs,
    :meth:`drop` when the pickup ends (closes it unused)."""

    def __init__(self, settings: SandboxSettings) -> None:
        self._settings = settings
        self._held: Sandbox | SandboxError | None = None

    def name(self, job_id: str) -> str:
        """The job's sandbox name in this slot: its own in this process and slot, so that
        two runs of one job on one machine (a run taken over by another worker there, see
        tiergate.jobs.state.lease) never share, make or remove each other's workspace."""
        return f"{job_id}.{os.getpid()}-{self._settings.uid}"

    def make(self, message: JobMessage) -> None:
        self.drop()
        if message.replay_of or message.resent:
            return
        if (Path(self._settings.work_dir) / self.name(message.id)).exists():
            return
        try:
            self._held = Sandbox(self.name(message.id), message.spec.limits, self._settings)
        except SandboxError as exc:
            self._held = exc  # raised where the job's sandbox is needed, with its verdict

    def take(self, job_id: str, limits: JobLimits, root: Path | None) -> Sandbox:
        """The job's sandbox in ``root``: the one made at pickup, else a new one."""
        held, self._held = self._held, None
        if isinstance(held, SandboxError):
            raise held
        if held is None:
            return Sandbox(self.name(job_id), limits, self._settings, root=root)
        try:
            held.use_root(root)
        except SandboxError:
            held.close()
            raise
        return held

    def drop(self) -> None:
        held, self._held = self._held, None
        if isinstance(held, Sandbox):
            held.close()


class CancelWatch:
    """From :meth:`start` to :meth:`stop`, asks the store every ``interval`` seconds
    whether the job's cancel was requested; when it was, sets :attr:`cancelled` and kills
    the sandbox's command."""

    def __init__(self, store: JobStore, job_id: str, sandbox: Sandbox, interval: float) -> None:
        self._store, self._job_id, self._sandbox = store, job_id, sandbox
        self._interval = interval
        self.cancelled = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> CancelWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                if self._store.cancel_requested(self._job_id):
                    self.cancelled.set()
                    self._sandbox.kill()
                    return
            except StorageError:
                continue


def store_artifacts(
    store: JobStore,
    job_id: str,
    sandbox: Sandbox,
    trajectory: list[TrajectoryEntry],
    verifier_log: str | None,
    run: int | None = None,
) -> None:
    lines = "".join(json.dumps(entry, default=str) + "\n" for entry in trajectory)
    store.put_artifact(job_id, "trajectory", lines.encode(), run)
    if verifier_log is not None:
        store.put_artifact(job_id, "verifier_log", verifier_log.encode(), run)
    # Written to a file beside the workspace and streamed up from it: a job may fill its
    # whole disk_mb, which the worker's memory is not sized for.
    archive = sandbox.archive()
    try:
        store.put_artifact_file(job_id, "workspace", archive, run)
    finally:
        archive.unlink(missing_ok=True)


def unpack_upload(
    store: JobStore, owner: str, upload_id: str, sandbox: Sandbox, max_bytes: int
) -> bool:
    """Unpack the owner's upload into the workspace: fetched to a file beside the workspace
    (not in it) a chunk at a time, which :meth:`Sandbox.extract` reads a block at a time,
    then removed; False when the upload no longer exists."""
    path = sandbox.root / "upload.tar"
    try:
        if not store.read_upload_to(owner, upload_id, path):
            return False
        sandbox.extract(path, max_bytes=max_bytes)
        return True
    finally:
        path.unlink(missing_ok=True)


def verifier_verdict(exit_code: int, timed_out: bool, cancelled: bool) -> tuple[FailureKind, str]:
    """A verifier that ran and judged (any exit status below 126, a wrong answer included)
    shows the environment works; 126 and up (not executable, not found, killed by a signal)
    or a negative status (the sandbox itself killed) is a crash of the environment. A
    timeout or a cancellation says nothing."""
    if timed_out or cancelled:
        return ("neutral", "")
    if exit_code >= 126 or exit_code < 0:
        return ("verifier", f"the verifier crashed (exit {exit_code})")
    return ("ok", "")


def read_reward(workspace: Path, name: str | None) -> float | None:
    """The reward in the file ``name`` in ``workspace`` (:func:`read_rewards`)."""
    return read_rewards(workspace, name)[0]


def read_rewards(workspace: Path, name: str | None) -> tuple[float | None, dict[str, float] | None]:
    """The reward file ``name`` in ``workspace``: ``(reward, named rewards)``.

    Either a number at its start (a line of text may follow): that is the reward, with no
    named rewards. Or a JSON object of up to :data:`MAX_NAMED_REWARDS` names
    (``[A-Za-z0-9_.-]``, up to 64 characters) to numbers, a verifier that scores several
    things at once (``{"correct": 1, "format": 0.5}``): the reward is their sum (reward
    functions weighted alike, as TRL's GRPO trainer sums them by default) and each is kept
    by name, so that a trainer can normalize each within its group. Anything else (no such
    file inside the workspace, not a finite number, a name or count past the bounds, a file
    over :data:`REWARD_MAX_BYTES`, which is never read whole: the verifier may write one as
    large as the job's disk limit) is no reward."""
    if not name:
        return None, None
    path = (workspace / name).resolve()
    if not path.is_relative_to(workspace.resolve()) or not path.is_file():
        return None, None
    try:
        with path.open("rb") as reward:
            raw = reward.read(REWARD_MAX_BYTES + 1)
    except OSError:
        return None, None
    if len(raw) > REWARD_MAX_BYTES:
        log.warning(
            "the reward file %r is over %d bytes: read as no reward", name[:200], REWARD_MAX_BYTES
        )
        return None, None
    try:
        text = raw.decode().strip()
        if text.startswith("{"):
            named = _named_rewards(json.loads(text))
            if named is None:
                return None, None
            value = math.fsum(named.values())
            return (value, named) if math.isfinite(value) else (None, None)
        value = float(text.split()[0])
    # UnicodeDecodeError and JSONDecodeError are ValueErrors; a deeply nested object is a
    # RecursionError; a sum past a float an OverflowError.
    except (ValueError, IndexError, RecursionError, OverflowError):
        return None, None
    return (value, None) if math.isfinite(value) else (None, None)


def _named_rewards(found: object) -> dict[str, float] | None:
    if not isinstance(found, dict) or not 0 < len(found) <= MAX_NAMED_REWARDS:
        return None
    named = {}
    for key, value in found.items():
        if not _REWARD_NAME.fullmatch(key) or isinstance(value, bool):
            return None
        if not isinstance(value, int | float) or not math.isfinite(value):
            return None
        named[key] = float(value)
    return named
