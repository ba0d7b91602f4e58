"""The sandbox: every command of a job runs under bubblewrap with no network, a private
``/tmp``, read-only ``/usr``, the job's workspace at ``/workspace``, and limits.

Limits: memory, process count and CPU through a cgroup (v2 ``memory.max``/``pids.max``/
``cpu.max``, or v1's memory, pids and cpu controllers) when the worker may create one;
file size, open files and CPU seconds through rlimits always; the workspace's size after
every command. Running as root, commands drop to an unprivileged uid inside the sandbox
(so files come out owned by that uid and RLIMIT_NPROC binds).
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import shutil
import signal
import subprocess
import tarfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tiergate.queue.schema import JobLimits
from tiergate.settings import SandboxSettings

CGROUP_ROOT = Path("/sys/fs/cgroup")


class SandboxError(Exception):
    """The sandbox itself failed (not the command in it)."""


@dataclass(frozen=True, slots=True)
class CommandResult:
    exit_code: int
    output: str
    timed_out: bool
    seconds: float


def _traversable(path: Path) -> bool:
    return all(os.stat(p).st_mode & 0o001 for p in [path, *path.resolve().parents])


def truncate(text: str, limit: int) -> str:
    """Keep the head and the tail, which is where errors are."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} characters cut ...]\n{text[-half:]}"


class _Cgroup:
    """A per-job cgroup (v2, or v1 controllers), or nothing where we may not create one."""

    def __init__(self, name: str, limits: JobLimits) -> None:
        self.paths: list[Path] = []
        self.procs_files: list[Path] = []
        try:
            if (CGROUP_ROOT / "cgroup.controllers").exists():
                self._v2(name, limits)
            elif (CGROUP_ROOT / "memory").is_dir():
                self._v1(name, limits)
        except OSError:
            self.close()
            self.paths, self.procs_files = [], []

    def _v2(self, name: str, limits: JobLimits) -> None:
        path = CGROUP_ROOT / f"tiergate-{name}"
        path.mkdir(exist_ok=True)  # left behind by a worker that was killed
        self.paths.append(path)
        (path / "memory.max").write_text(str(limits.memory_mb * 1024 * 1024))
        (path / "pids.max").write_text("256")
        (path / "cpu.max").write_text(f"{int(limits.cpus * 100_000)} 100000")
        self.procs_files.append(path / "cgroup.procs")

    def _v1(self, name: str, limits: JobLimits) -> None:
        settings = {
            "memory": {"memory.limit_in_bytes": str(limits.memory_mb * 1024 * 1024)},
            "pids": {"pids.max": "256"},
            "cpu": {
                "cpu.cfs_period_us": "100000",
                "cpu.cfs_quota_us": str(int(limits.cpus * 100_000)),
            },
        }
        for controller, values in settings.items():
            base = CGROUP_ROOT / controller
            if not base.is_dir():
                continue
            path = base / f"tiergate-{name}"
            path.mkdir(exist_ok=True)  # left behind by a worker that was killed
            self.paths.append(path)
            for file, value in values.items():
                (path / file).write_text(value)
            self.procs_files.append(path / "tasks")

    @property
    def active(self) -> bool:
        return bool(self.procs_files)

    def close(self) -> None:
        for path in self.paths:
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)  # the last processes are still exiting


class Sandbox:
    """One job's sandbox; commands run one at a time."""

    def __init__(self, job_id: str, limits: JobLimits, settings: SandboxSettings) -> None:
        if shutil.which("bwrap") is None:
            raise SandboxError("bubblewrap (bwrap) is not installed")
        self._limits = limits
        self._settings = settings
        self._as_root = os.geteuid() == 0
        base = Path(settings.work_dir)
        base.mkdir(parents=True, exist_ok=True)
        self.root = base / job_id
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
        self._cgroup = _Cgroup(job_id, limits) if self._as_root else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    # -- files ------------------------------------------------------------------------------

    def write_files(self, files: dict[str, str]) -> None:
        for rel, content in files.items():
            target = (self.workspace / rel).resolve()
            if not target.is_relative_to(self.workspace.resolve()):
                raise SandboxError(f"{rel!r} is outside the workspace")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)

    def extract(self, archive: bytes) -> None:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(self.workspace, filter="data")

    def archive(self) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            tar.add(self.workspace, arcname="workspace")
        return buffer.getvalue()

    def workspace_bytes(self) -> int:
        total = 0
        for dirpath, _dirs, files in os.walk(self.workspace):
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(dirpath, name)).st_size
        return total

    # -- commands ---------------------------------------------------------------------------

    def _argv(self, command: str, cpu_seconds: int) -> list[str]:
        bwrap = [
            "bwrap",
            "--unshare-all",
            "--die-with-parent",
            "--new-session",
            "--clearenv",
            "--ro-bind",
            "/usr",
            "/usr",
        ]
        for name in ("bin", "sbin", "lib", "lib64", "lib32"):
            if Path(f"/{name}").is_symlink():
                bwrap += ["--symlink", f"usr/{name}", f"/{name}"]
            elif Path(f"/{name}").is_dir():
                bwrap += ["--ro-bind", f"/{name}", f"/{name}"]
        bwrap += [
            "--ro-bind-try",
            "/etc/alternatives",
            "/etc/alternatives",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--tmpfs",
            "/tmp",
            "--bind",
            str(self.workspace),
            "/workspace",
            "--chdir",
            "/workspace",
            "--setenv",
            "PATH",
            "/usr/local/bin:/usr/bin:/bin",
            "--setenv",
            "HOME",
            "/workspace",
            "--setenv",
            "LANG",
            "C.UTF-8",
        ]
        bwrap += ["--cap-drop", "ALL", "--", "/bin/sh", "-c", command]
        if self._as_root:
            # bubblewrap then runs unprivileged (user namespaces), as it does in a pod.
            bwrap = [
                "setpriv",
                f"--reuid={self._settings.uid}",
                f"--regid={self._settings.gid}",
                "--clear-groups",
                "--no-new-privs",
                "--",
                *bwrap,
            ]
        rlimits = [
            "prlimit",
            f"--fsize={self._limits.disk_mb * 1024 * 1024}",
            "--nofile=1024",
            f"--cpu={cpu_seconds}",
            "--core=0",
        ]
        if self._as_root:
            rlimits.append("--nproc=512")
        argv = [*rlimits, "--", *bwrap]
        if self._cgroup is not None and self._cgroup.active:
            enter = "; ".join(f"echo $$ > {shlex.quote(str(p))}" for p in self._cgroup.procs_files)
            argv = ["/bin/sh", "-c", f'{enter}; exec "$@"', "sandbox", *argv]
        return argv

    def run(self, command: str, timeout: float) -> CommandResult:
        if self._as_root:
            os.chown(self.workspace, self._settings.uid, self._settings.gid)
            for dirpath, dirs, files in os.walk(self.workspace):
                for name in dirs + files:
                    os.lchown(os.path.join(dirpath, name), self._settings.uid, self._settings.gid)
        started = time.monotonic()
        argv = self._argv(command, cpu_seconds=max(1, int(timeout * self._limits.cpus) + 1))
        with self._lock:
            self._proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        proc = self._proc
        timed_out = False
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            self.kill()
            out, _ = proc.communicate()
        finally:
            with self._lock:
                self._proc = None
        text = out.decode("utf-8", "replace")
        if timed_out:
            text += f"\n[timed out after {timeout:g}s]"
        return CommandResult(
            exit_code=proc.returncode if not timed_out else 124,
            output=truncate(text, self._settings.output_limit_chars),
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
