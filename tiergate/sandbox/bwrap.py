"""The command line a job's command runs under: rlimits (prlimit), then, as root, a drop to
the unprivileged sandbox user (setpriv), then bubblewrap with no network, a private
``/tmp``, read-only ``/usr`` and the workspace at ``/workspace``; in a user namespace that
cannot make another (``--disable-userns``), under the system-call filter of
:mod:`tiergate.sandbox.seccomp` (``--seccomp FD``).

The verifier's commands (``verifier=True``) also run with ``PYTHONSAFEPATH=1`` and
``PYTHONNOUSERSITE=1`` and ``HOME=/tmp``, so that Python puts neither the workspace nor a
user site directory in it on the import path, and no dotfile the agent left is read as
the home directory's.

With an environment (``root``: an unpacked root file system from
:mod:`tiergate.envs.cache`), that tree is bound read-only as ``/`` instead of the worker's
``/usr`` and friends, with no copy per job; the job's writable layer is tmpfs on ``/tmp``,
``/var/tmp`` and ``/run`` plus the workspace bind: bubblewrap 0.8 (Debian 12) has no
overlay options (``--overlay`` came in 0.10), so the root itself stays read-only and the
writable paths are exactly ``/tmp``, ``/var/tmp``, ``/run`` and ``/workspace``.

Bubblewrap runs unprivileged (user namespaces) either way, as it does in a pod, so a
root worker's sandbox is no stronger than a non-root one's and a bug in it gives no root.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from tiergate.jobsettings import SandboxSettings
from tiergate.protocol import SandboxLimits

# Run by /bin/sh before the sandbox: waits until the worker has put this shell into the
# job's cgroup (and says "run"), so that not one instruction runs outside the limits.
GATE = 'IFS= read -r go && [ "$go" = run ] && exec "$@" </dev/null; exit 125'

# A command's first process made before its command is known (tiergate.sandbox.sandbox's
# standby): /bin/sh waits, already in the job's cgroup, until the worker has written the
# command line to the script ``$1`` (:func:`standby_script`) and says "run".
STANDBY = 'IFS= read -r go && [ "$go" = run ] && . "$1"; exit 125'


def standby_script(argv: list[str]) -> str:
    """What :data:`STANDBY` runs: ``argv`` (quoted for /bin/sh), stdin closed."""
    return f"exec {shlex.join(argv)} </dev/null\n"


def bwrap_argv(
    workspace: Path,
    command: str,
    seccomp_fd: int | None = None,
    verifier: bool = False,
    root: Path | None = None,
) -> list[str]:
    argv = [
        "bwrap",
        "--unshare-all",
        "--unshare-user",  # --disable-userns needs it named
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
    ]
    if root is not None:
        argv += ["--ro-bind", str(root), "/", "--proc", "/proc", "--dev", "/dev"]
        argv += ["--tmpfs", "/tmp", "--tmpfs", "/var/tmp", "--tmpfs", "/run"]
    else:
        argv += ["--ro-bind", "/usr", "/usr"]
        for name in ("bin", "sbin", "lib", "lib64", "lib32"):
            if Path(f"/{name}").is_symlink():
                argv += ["--symlink", f"usr/{name}", f"/{name}"]
            elif Path(f"/{name}").is_dir():
                argv += ["--ro-bind", f"/{name}", f"/{name}"]
        argv += ["--ro-bind-try", "/etc/alternatives", "/etc/alternatives"]
        argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    argv += ["--bind", str(workspace), "/workspace", "--chdir", "/workspace"]
    argv += ["--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin"]
    argv += ["--setenv", "HOME", "/tmp" if verifier else "/workspace"]
    argv += ["--setenv", "LANG", "C.UTF-8"]
    if verifier:
        argv += ["--setenv", "PYTHONSAFEPATH", "1", "--setenv", "PYTHONNOUSERSITE", "1"]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    return [*argv, "--cap-drop", "ALL", "--", "/bin/sh", "-c", command]


def command_argv(
    workspace: Path,
    command: str,
    limits: SandboxLimits,
    settings: SandboxSettings,
    cpu_seconds: int,
    as_root: bool,
    gated: bool,
    seccomp_fd: int | None = None,
    verifier: bool = False,
    root: Path | None = None,
) -> list[str]:
    """The whole command line; ``gated`` puts :data:`GATE` in front (stdin must be a pipe);
    ``seccomp_fd`` must reach bubblewrap open (``pass_fds``); ``root``: an environment's
    unpacked root (None: the worker's own system, read-only)."""
    argv = bwrap_argv(workspace, command, seccomp_fd, verifier, root)
    if as_root:
        argv = [
            "setpriv",
            f"--reuid={settings.uid}",
            f"--regid={settings.gid}",
            "--clear-groups",
            "--no-new-privs",
            "--",
            *argv,
        ]
    rlimits = [
        "prlimit",
        f"--fsize={limits.disk_mb * 1024 * 1024}",
        "--nofile=1024",
        f"--cpu={cpu_seconds}",
        "--core=0",
    ]
    if as_root:
        # Counts every process of the sandbox's uid, which is this job slot's alone
        # (SandboxSettings.for_slot): no other running job's processes count against it.
        rlimits.append("--nproc=512")
    argv = [*rlimits, "--", *argv]
    return ["/bin/sh", "-c", GATE, "sandbox", *argv] if gated else argv
