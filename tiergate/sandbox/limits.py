"""One job's cgroup (memory, process count and CPU), and the start-up probe for them.

A job without these limits can take the worker's node down (a fork bomb, a runaway
allocation), so a missing cgroup is an error unless the operator opted out with
``allow_unlimited``; the worker calls :func:`probe_limits` at start to fail once, clearly,
rather than on every job. The same probe builds the system-call filter
(:mod:`tiergate.sandbox.seccomp`), required unless ``allow_no_seccomp``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

from tiergate.jobsettings import SandboxSettings
from tiergate.protocol import SandboxLimits
from tiergate.sandbox.cgroup import CgroupParent, find_parent, unavailable, write
from tiergate.sandbox.errors import LimitsUnavailable, SandboxError
from tiergate.sandbox.seccomp import probe_seccomp

_PERIOD_US = 100_000


class JobCgroup:
    """A cgroup per job: created with its limits, entered by each command, removed at close."""

    def __init__(
        self, parent: CgroupParent, name: str, limits: SandboxLimits, max_processes: int
    ) -> None:
        self.parent = parent
        self.dirs: list[Path] = []
        memory = str(limits.memory_mb * 1024 * 1024)
        quota = max(1000, int(limits.cpus * _PERIOD_US))
        if parent.version == 2:
            values = [
                {
                    "memory.max": memory,
                    "memory.swap.max?": "0",
                    "pids.max": str(max_processes),
                    "cpu.max": f"{quota} {_PERIOD_US}",
                }
            ]
        else:
            values = [
                {"memory.limit_in_bytes": memory, "memory.memsw.limit_in_bytes?": memory},
                {"pids.max": str(max_processes)},
                {"cpu.cfs_period_us": str(_PERIOD_US), "cpu.cfs_quota_us": str(quota)},
            ]
        try:
            for base, files in zip(parent.dirs, values, strict=True):
                path = base / name
                with contextlib.suppress(OSError):
                    path.rmdir()  # left behind by a worker that was killed: start afresh
                path.mkdir(exist_ok=True)
                self.dirs.append(path)
                for file, value in files.items():
                    optional = file.endswith("?")  # absent without swap accounting
                    try:
                        write(path / file.rstrip("?"), value)
                    except OSError:
                        if not optional:
                            raise
        except OSError as exc:
            self.close()
            raise LimitsUnavailable(
                f"could not create the job's cgroup under {parent.describe()}: {exc}"
            ) from exc

    @property
    def _procs_files(self) -> list[Path]:
        return [d / ("cgroup.procs" if self.parent.version == 2 else "tasks") for d in self.dirs]

    def add(self, pid: int) -> None:
        """Put ``pid`` (before it runs the command) into the job's cgroup."""
        for procs in self._procs_files:
            try:
                write(procs, str(pid))
            except OSError as exc:
                hint = (
                    " (on cgroup v2 the worker itself must run inside the delegated subtree)"
                    if self.parent.version == 2 and isinstance(exc, PermissionError)
                    else ""
                )
                raise SandboxError(f"could not put the command into {procs}: {exc}{hint}") from exc

    def processes(self) -> int:
        """How many processes the job has now (the pids controller's count)."""
        pids = self.dirs[0] if self.parent.version == 2 else self.dirs[1]
        try:
            return int((pids / "pids.current").read_text())
        except (OSError, ValueError):
            return 0

    def pids(self) -> list[int]:
        """The job's processes now (none when the cgroup cannot be read)."""
        if not self.dirs:
            return []
        try:
            return [int(pid) for pid in (self.dirs[0] / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def kill(self) -> None:
        """Kill whatever is still in the cgroup (so that it can be removed)."""
        if not self.dirs:
            return
        if self.parent.version == 2 and (self.dirs[0] / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                write(self.dirs[0] / "cgroup.kill", "1")
            return
        with contextlib.suppress(OSError):
            for pid in self._procs_files[0].read_text().split():
                with contextlib.suppress(OSError):
                    os.kill(int(pid), signal.SIGKILL)

    def close(self) -> list[Path]:
        """Remove the cgroup; returns the directories that could not be removed."""
        self.kill()
        left = []
        for path in self.dirs:
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)  # the last processes are still exiting
            else:
                left.append(path)
        self.dirs = []
        return left


def probe_limits(settings: SandboxSettings) -> str:
    """Check that jobs will get their limits: make a test cgroup where the jobs' go, move
    a process into it and remove it; and build the system-call filter. Returns what was
    found; raises :class:`LimitsUnavailable` (unless ``allow_unlimited``), or its subclass
    :class:`SeccompUnavailable` (unless ``allow_no_seccomp``), saying what to do otherwise."""
    return f"{_probe_cgroup(settings)}; {probe_seccomp(settings)}"


def _probe_cgroup(settings: SandboxSettings) -> str:
    try:
        parent = find_parent(settings)
        problem = _try(parent, settings)
        if problem is not None:
            raise unavailable(settings, [f"{parent.describe()}: {problem}"])
    except LimitsUnavailable as exc:
        if settings.allow_unlimited:
            return f"limits OFF (jobs.sandbox.allow_unlimited=true); no cgroup: {exc.reason}"
        raise
    return f"{parent.describe()} (memory, pids, cpu limits)"


def _try(parent: CgroupParent, settings: SandboxSettings) -> str | None:
    """What a job's cgroup meets: None when it works end to end, else the problem."""
    try:
        cgroup = JobCgroup(
            parent, f"probe-{uuid.uuid4().hex[:12]}", SandboxLimits(), settings.max_processes
        )
    except SandboxError as exc:
        return str(exc)
    try:
        proc = subprocess.Popen(["/bin/sh", "-c", "read -r _"], stdin=subprocess.PIPE)
        try:
            cgroup.add(proc.pid)
        finally:
            proc.kill()
            proc.wait()
            if proc.stdin is not None:
                proc.stdin.close()
    except (SandboxError, OSError) as exc:
        return str(exc)
    finally:
        left = cgroup.close()
    return f"could not remove the test cgroup {left[0]}" if left else None
