"""One job's sandbox: its workspace, its cgroup, and its commands, run one at a time.

Limits: memory, process count and CPU through the job's cgroup (required unless the
operator set ``allow_unlimited``); file size, open files and CPU seconds through rlimits;
the workspace's size through :meth:`Sandbox.check_disk`, which the runner calls after
each stage. Output is captured bounded, whatever a command prints.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tiergate.queue.schema import JobLimits
from tiergate.sandbox import files
from tiergate.sandbox.bwrap import command_argv
from tiergate.sandbox.capture import read_bounded
from tiergate.sandbox.cgroup import find_parent
from tiergate.sandbox.errors import SandboxError
from tiergate.sandbox.limits import JobCgroup
from tiergate.settings import SandboxSettings

_MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class CommandResult:
    exit_code: int
    output: str
    timed_out: bool
    seconds: float


def _traversable(path: Path) -> bool:
    return all(os.stat(p).st_mode & 0o001 for p in [path, *path.resolve().parents])


class Sandbox:
    """One job's sandbox; commands run one at a time."""

    def __init__(self, job_id: str, limits: JobLimits, settings: SandboxSettings) -> None:
        if shutil.which("bwrap") is None:
            raise SandboxError("bubblewrap (bwrap) is not installed")
        if not job_id or "/" in job_id or "\0" in job_id or job_id.strip(".") == "":
            raise SandboxError(f"{job_id!r} cannot name a sandbox")
        self._limits = limits
        self._settings = settings
        self._as_root = os.geteuid() == 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._cgroup = self._make_cgroup(job_id)
        base = Path(settings.work_dir)
        self.root = base / job_id
        try:
            base.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(self.root, ignore_errors=True)
            self.workspace = self.root / "workspace"
            self.workspace.mkdir(parents=True)
            if self._as_root:
                # The unprivileged sandbox user must reach its workspace (but list nothing else).
                for path in (base, self.root):
                    path.chmod(0o711)
                if not _traversable(base):
                    raise SandboxError(
                        f"sandbox.work_dir {base} must be reachable by other users "
                        "(every parent directory needs o+x)"
                    )
        except (OSError, SandboxError) as exc:
            self.close()
            if isinstance(exc, SandboxError):
                raise
            raise SandboxError(f"cannot make the workspace under {base}: {exc}") from exc

    def _make_cgroup(self, job_id: str) -> JobCgroup | None:
        """The job's cgroup; without one, an error unless the operator allowed that."""
        try:
            parent = find_parent(self._settings)
            return JobCgroup(parent, f"job-{job_id}", self._limits, self._settings.max_processes)
        except SandboxError:
            if self._settings.allow_unlimited:
                return None
            raise

    # -- files ------------------------------------------------------------------------------

    def write_files(self, files_: dict[str, str]) -> None:
        files.write_files(self.workspace, files_)

    def extract(self, archive: bytes, max_bytes: int | None = None) -> None:
        """Unpack a tar archive; refused when its files add up to more than ``max_bytes``
        (default: the job's disk limit)."""
        limit = self._limits.disk_mb * _MiB if max_bytes is None else max_bytes
        files.extract(self.workspace, archive, limit)

    def archive(self) -> bytes:
        return files.archive(self.workspace)

    def workspace_bytes(self) -> int:
        return files.workspace_bytes(self.workspace)

    def check_disk(self, limit_bytes: int | None = None) -> int:
        """The workspace's size in bytes; :class:`SandboxError` when over ``limit_bytes``
        (default: the job's ``disk_mb``)."""
        limit = self._limits.disk_mb * _MiB if limit_bytes is None else limit_bytes
        used = self.workspace_bytes()
        if used > limit:
            raise SandboxError(
                f"the workspace holds {used} bytes, over the job's disk limit of {limit} "
                f"bytes (disk_mb={self._limits.disk_mb})"
            )
        return used

    # -- commands ---------------------------------------------------------------------------

    def run(self, command: str, timeout: float) -> CommandResult:
        if self._as_root:
            uid, gid = self._settings.uid, self._settings.gid
            os.chown(self.workspace, uid, gid)
            for dirpath, dirs, names in os.walk(self.workspace):
                for name in dirs + names:
                    os.lchown(os.path.join(dirpath, name), uid, gid)
        started = time.monotonic()
        deadline = started + timeout
        gated = self._cgroup is not None
        argv = command_argv(
            self.workspace,
            command,
            self._limits,
            self._settings,
            cpu_seconds=max(1, int(timeout * self._limits.cpus) + 1),
            as_root=self._as_root,
            gated=gated,
        )
        with self._lock:
            proc = self._proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.PIPE if gated else subprocess.DEVNULL,
                start_new_session=True,
            )
        assert proc.stdout is not None
        try:
            if self._cgroup is not None and proc.stdin is not None:
                try:
                    self._cgroup.add(proc.pid)
                except SandboxError:
                    self.kill()
                    proc.wait()
                    raise
                with contextlib.suppress(BrokenPipeError):  # killed (cancelled) already
                    proc.stdin.write(b"run\n")
                    proc.stdin.close()
            limit = self._settings.output_limit_chars
            text, timed_out = read_bounded(proc.stdout, limit, deadline, self.kill)
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                self.kill()
                proc.wait()
        finally:
            proc.stdout.close()
            if proc.stdin is not None and not proc.stdin.closed:
                with contextlib.suppress(BrokenPipeError):
                    proc.stdin.close()
            with self._lock:
                self._proc = None
        if timed_out:
            text += f"\n[timed out after {timeout:g}s]"
        return CommandResult(
            exit_code=proc.returncode if not timed_out else 124,
            output=text,
            timed_out=timed_out,
            seconds=time.monotonic() - started,
        )

    def kill(self) -> None:
        """Kill the running command and everything it started."""
        with self._lock:
            proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

    def close(self) -> None:
        self.kill()
        if self._cgroup is not None:
            self._cgroup.close()
        shutil.rmtree(self.root, ignore_errors=True)
