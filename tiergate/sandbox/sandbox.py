"""One job's sandbox: its workspace, its cgroup, and its commands, run one at a time.

Commands start from a standby: a process made in advance (at the sandbox's start and after
each command, in the background), already in the job's cgroup, waiting to be told what to
run. Moving a process into a cgroup can wait for an RCU grace period in the kernel (about
10 ms here, whatever the process), so that wait is paid while the worker does something
else (its object-storage round trips at pickup, the model's turn between commands) and not
between a command being known and it running (tiergate bench sandbox).

Limits: memory, process count and CPU through the job's cgroup (required unless the
operator set ``allow_unlimited``); file size, open files and CPU seconds through rlimits;
the workspace's size through :meth:`Sandbox.check_disk`, which the runner calls after
each stage. Output is captured bounded, whatever a command prints. Every command runs
under the system-call filter (required unless the operator set ``allow_no_seccomp``).

The verifier runs on a copy (:meth:`Sandbox.prepare_verifier`, then ``run(...,
verifier=True)``), made after the agent's last command, so that nothing the agent runs
can touch it. What that guarantees, and what not:

- the reward file does not exist when the verifier starts (the agent's is removed from
  the copy): a reward is read only if the verifier's own commands wrote it, on the copy;
- the verifier's Python puts neither the workspace nor a user site directory in it on its
  import path (``PYTHONSAFEPATH=1``, ``PYTHONNOUSERSITE=1``, no ``PYTHONPATH``, ``HOME`` is
  the private ``/tmp``), so an ``os.py`` or ``sitecustomize.py`` the agent left is not
  imported by ``python3 script.py``, ``-c`` or ``-m``;
- the agent's workspace is left as the agent left it (the job's artifact), whatever the
  verifier does to the copy;
- not guaranteed: whatever the verifier itself chooses to read or run from the workspace
  is the agent's to change: its scripts and test files if they are in the workspace, a
  ``conftest.py`` or ``pytest.ini`` that pytest finds there (and the directory pytest puts
  on ``sys.path`` itself), a ``Makefile``, ``package.json`` and the like, an explicit
  ``sys.path`` change or ``cd`` into the workspace's packages. A verifier to be trusted
  brings its own files (in its command) and treats the workspace as data.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from tiergate.jobsettings import SandboxSettings
from tiergate.protocol import SandboxLimits
from tiergate.sandbox import files, owned, seccomp
from tiergate.sandbox.bwrap import STANDBY, command_argv, standby_script
from tiergate.sandbox.capture import read_bounded
from tiergate.sandbox.cgroup import find_parent
from tiergate.sandbox.diskwatch import DiskWatch
from tiergate.sandbox.errors import SandboxError
from tiergate.sandbox.limits import JobCgroup

_MiB = 1024 * 1024

# The whole environment of every process the worker starts for a job. The sandbox's pid 1
# is bubblewrap's reaper, which never execs and keeps the environment bubblewrap was started
# with (readable as /proc/1/environ inside): ``--clearenv`` clears only what the command
# sees. So nothing of the worker's environment (storage keys, the workers' API key, Kafka
# passwords, the jobs settings) may reach bubblewrap or the launchers before it.
LAUNCH_ENV: dict[str, str] = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


@dataclass(frozen=True, slots=True)
class CommandResult:
    exit_code: int
    output: str
    timed_out: bool
    seconds: float


@dataclass(frozen=True, slots=True)
class _Standby:
    """A command's first process, in the job's cgroup, waiting for "run"."""

    proc: subprocess.Popen[bytes]
    seccomp_fd: int | None  # the filter's descriptor number in that process


def _traversable(path: Path) -> bool:
    return all(os.stat(p).st_mode & 0o001 for p in [path, *path.resolve().parents])


class Sandbox:
    """One job's sandbox; commands run one at a time."""

    def __init__(
        self,
        job_id: str,
        limits: SandboxLimits,
        settings: SandboxSettings,
        root: Path | None = None,
    ) -> None:
        """``root``: an environment's unpacked root file system (:mod:`tiergate.envs`),
        bound read-only as ``/``; None: the worker's own system, read-only."""
        if shutil.which("bwrap") is None:
            raise SandboxError("bubblewrap (bwrap) is not installed")
        if not job_id or "/" in job_id or "\0" in job_id or job_id.strip(".") == "":
            raise SandboxError(f"{job_id!r} cannot name a sandbox")
        self._limits = limits
        self._settings = settings
        self._root: Path | None = None
        self._standby: Future[_Standby] | None = None
        self._closed = False
        # Wall-clock time (time.time()) the first command's process was spawned: the end of
        # pickup-to-first-command (tiergate bench sandbox).
        self.first_spawn: float | None = None
        self._as_root = os.geteuid() == 0
        self._filter = seccomp.program(settings)  # before anything is made: may raise
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._cgroup = self._make_cgroup(job_id)
        base = Path(settings.work_dir)
        self.root = base / job_id
        try:
            base.mkdir(parents=True, exist_ok=True)
            owned.remove_tree(self.root)
            self.workspace = self.root / "workspace"
            self.verifier_workspace = self.root / "verify"
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
            self.use_root(root)
        except (OSError, SandboxError) as exc:
            self.close()
            if isinstance(exc, SandboxError):
                raise
            raise SandboxError(f"cannot make the workspace under {base}: {exc}") from exc
        # The script a standby runs: the worker's alone (outside every sandbox's mounts).
        self._script = self.root / "command.sh"
        self._prepare_standby()

    def use_root(self, root: Path | None) -> None:
        """Run the next commands in ``root`` (an environment's unpacked root file system;
        None: the worker's own system): a sandbox may be made before its environment is
        fetched."""
        if root is not None and self._as_root and not _traversable(root):
            raise SandboxError(
                f"the environment's root {root} must be reachable by other users "
                "(every parent directory of sandbox.cache_dir needs o+x)"
            )
        self._root = root

    # -- standby ----------------------------------------------------------------------------

    def _prepare_standby(self) -> None:
        """Make the next command's first process in the background (with a cgroup only:
        without one, nothing is moved and a command spawns as fast at once)."""
        if self._cgroup is None or self._closed:
            return
        made: Future[_Standby] = Future()
        self._standby = made

        def make() -> None:
            try:
                made.set_result(self._spawn_standby())
            except BaseException as exc:  # handed to the command that needs it
                made.set_exception(exc)

        threading.Thread(target=make, name="sandbox-standby", daemon=True).start()

    def _spawn_standby(self) -> _Standby:
        assert self._cgroup is not None
        filter_fd = None if self._filter is None else seccomp.as_fd(self._filter)
        try:
            proc = _launch(
                ["/bin/sh", "-c", STANDBY, "sandbox", str(self._script)],
                filter_fd,
                subprocess.PIPE,
            )
        except OSError as exc:
            raise SandboxError(f"cannot start a command: {exc}") from exc
        finally:
            if filter_fd is not None:
                os.close(filter_fd)
        try:
            self._cgroup.add(proc.pid)
        except SandboxError:
            _discard(proc)
            raise
        return _Standby(proc, filter_fd)

    def _take_standby(self) -> _Standby:
        made, self._standby = self._standby, None
        if made is None:  # closed, or the last one failed to start: one now, or the error
            if self._closed:
                raise SandboxError("the sandbox is closed")
            return self._spawn_standby()
        try:
            return made.result(timeout=60)
        except TimeoutError as exc:
            raise SandboxError("a command's process did not start within 60 s") from exc

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

    def extract(self, archive: bytes | Path, max_bytes: int | None = None) -> None:
        """Unpack a tar archive (its bytes, or a file) into the workspace, as the job's own
        user (see :func:`files.extract`); refused when its files add up to more than
        ``max_bytes`` (default: the job's disk limit) or it has more members than
        ``sandbox.max_upload_members``."""
        limit = self._limits.disk_mb * _MiB if max_bytes is None else max_bytes
        run_as: tuple[int, int] | None = None
        if self._as_root:
            # The slot's own ids where the sandbox has them, else the settings' user.
            uid = int(getattr(self, "_uid", self._settings.uid))
            gid = int(getattr(self, "_gid", self._settings.gid))
            run_as = (uid, gid)
            os.chown(self.workspace, uid, gid)
        source = archive if isinstance(archive, Path) else self.root / "upload.tar"
        try:
            if isinstance(archive, bytes):
                fd = os.open(source, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "wb") as out:
                    out.write(archive)
            with source.open("rb") as stream:
                files.extract(
                    self.workspace, stream, limit, self._settings.max_upload_members, run_as
                )
        except OSError as exc:
            raise SandboxError(f"cannot read the workspace archive: {exc.strerror}") from exc
        finally:
            if source is not archive:
                source.unlink(missing_ok=True)

    def archive(self) -> Path:
        """The workspace artifact (``workspace.tar.gz``), written to a file beside the
        workspace (not in it, so that no job's file can be that path); the caller uploads it
        and removes it (:meth:`close` does too)."""
        target = self.root / "artifact.tar.gz"
        try:
            files.archive(self.workspace, target)
        except BaseException:
            target.unlink(missing_ok=True)
            raise
        return target

    def workspace_bytes(self) -> int:
        return files.workspace_bytes(self.workspace)

    def check_disk(self, limit_bytes: int | None = None, verifier: bool = False) -> int:
        """The workspace's (or the verifier's copy's) size in bytes; :class:`SandboxError`
        when over ``limit_bytes`` (default: the job's ``disk_mb``)."""
        limit = self._limits.disk_mb * _MiB if limit_bytes is None else limit_bytes
        used = files.workspace_bytes(self.verifier_workspace if verifier else self.workspace)
        if used > limit:
            which = "the verifier's copy of the workspace" if verifier else "the workspace"
            raise SandboxError(
                f"{which} holds {used} bytes, over the job's disk limit of {limit} "
                f"bytes (disk_mb={self._limits.disk_mb})"
            )
        return used

    def prepare_verifier(self, reward_file: str | None) -> list[str]:
        """Copy the workspace to :attr:`verifier_workspace` (anew) for the verifier, without
        ``reward_file``; returns what the copy left out (see :func:`files.copy_tree`)."""
        owned.remove_tree(self.verifier_workspace)
        try:
            left = files.copy_tree(self.workspace, self.verifier_workspace)
        except OSError as exc:
            raise SandboxError(f"cannot copy the workspace for the verifier: {exc}") from exc
        if reward_file:
            self._remove_in_copy(reward_file)
        return left

    def _remove_in_copy(self, name: str) -> None:
        top = self.verifier_workspace.resolve()
        path = self.verifier_workspace / name
        # Resolved first: a parent the agent made a link out of the copy is not followed.
        resolved = path.parent.resolve() / path.name
        if not resolved.is_relative_to(top) or resolved == top:
            return  # out of the copy: never read as the reward either
        if resolved.is_dir() and not resolved.is_symlink():
            owned.remove_tree(resolved)
        elif os.path.lexists(resolved):
            resolved.unlink()

    # -- commands ---------------------------------------------------------------------------

    def run(self, command: str, timeout: float, verifier: bool = False) -> CommandResult:
        """Run ``command`` in the workspace, or (``verifier``) in the verifier's copy with
        the verifier's environment."""
        workspace = self.verifier_workspace if verifier else self.workspace
        if self._as_root:
            uid, gid = self._settings.uid, self._settings.gid
            os.chown(workspace, uid, gid)
            for dirpath, dirs, names in os.walk(workspace):
                for name in dirs + names:
                    os.lchown(os.path.join(dirpath, name), uid, gid)
        started = time.monotonic()
        deadline = started + timeout
        line = functools.partial(
            command_argv,
            workspace,
            command,
            self._limits,
            self._settings,
            cpu_seconds=max(1, int(timeout * self._limits.cpus) + 1),
            as_root=self._as_root,
            gated=False,
            verifier=verifier,
            root=self._root,
        )
        if self._cgroup is not None:
            standby = self._take_standby()
            argv = line(seccomp_fd=standby.seccomp_fd)
            fd = os.open(self._script, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as script:
                script.write(standby_script(argv))
            proc = standby.proc
            with self._lock:
                self._proc = proc
        else:
            proc = self._spawn(line)
        if self.first_spawn is None:
            self.first_spawn = time.time()
        assert proc.stdout is not None
        try:
            if proc.stdin is not None:
                with contextlib.suppress(BrokenPipeError):  # killed (cancelled) already
                    proc.stdin.write(b"run\n")
                    proc.stdin.close()
            limit = self._settings.output_limit_chars
            with DiskWatch(
                workspace,
                self._limits.disk_mb * _MiB,
                self._settings.max_workspace_entries,
                self.kill,
                self._settings.disk_watch_seconds,
                pids=self._cgroup.pids if self._cgroup is not None else None,
            ) as watch:
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
            self._prepare_standby()
        if watch.exceeded is not None:
            raise SandboxError(watch.exceeded)
        if timed_out:
            text += f"\n[timed out after {timeout:g}s]"
        return CommandResult(
            exit_code=proc.returncode if not timed_out else 124,
            output=text,
            timed_out=timed_out,
            seconds=time.monotonic() - started,
        )

    def _spawn(self, line: Callable[..., list[str]]) -> subprocess.Popen[bytes]:
        """A command without a cgroup to move it into: spawned when it is run; ``line``
        makes its command line given the filter's descriptor."""
        filter_fd = None if self._filter is None else seccomp.as_fd(self._filter)
        try:
            with self._lock:
                proc = self._proc = _launch(
                    line(seccomp_fd=filter_fd), filter_fd, subprocess.DEVNULL
                )
        finally:
            if filter_fd is not None:
                os.close(filter_fd)
        return proc

    def process_count(self) -> int:
        """The job's processes now (0 without a cgroup)."""
        return 0 if self._cgroup is None else self._cgroup.processes()

    def kill(self) -> None:
        """Kill the running command and everything it started."""
        with self._lock:
            proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

    def close(self) -> None:
        """Kill what runs, remove the cgroup and the files; a second call does nothing."""
        self._closed = True
        self.kill()
        made, self._standby = self._standby, None
        if made is not None:
            with contextlib.suppress(Exception):
                _discard(made.result(timeout=60).proc)
        if self._cgroup is not None:
            self._cgroup.close()
        owned.remove_tree(self.root)


def _discard(proc: subprocess.Popen[bytes]) -> None:
    """Kill a standby that will not run (its session: nothing else is in it yet)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()


def _launch(argv: list[str], filter_fd: int | None, stdin: int) -> subprocess.Popen[bytes]:
    """A process of the sandbox: a session of its own (its group is what is killed), the
    launch environment only, output and errors on one pipe, and no descriptor but the
    seccomp filter's."""
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=stdin,
        start_new_session=True,
        pass_fds=() if filter_fd is None else (filter_fd,),
        env=LAUNCH_ENV,
    )
