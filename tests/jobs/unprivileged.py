"""A worker process as the image's unprivileged user (uid 65534), with a cgroup parent
delegated to it the way an operator would (chown of the parent under each v1 controller,
or of a v2 directory with its ``cgroup.procs``, ``cgroup.threads`` and
``cgroup.subtree_control``, as the kernel's delegation model says), for the tests that must
hold as that user.

On cgroup v2 an unprivileged process may move a process only where it can write the
``cgroup.procs`` of the cgroup that both ends share, so a worker must run inside its
delegated parent: it starts in the parent's ``worker`` leaf (it moves itself there while
still root, then drops to uid 65534), as a pod's or a ``Delegate=yes`` unit's worker does.
On v1 no move is needed. This machine and CI's are v1: the v2 branch follows the kernel's
documented rules (Documentation/admin-guide/cgroup-v2.rst, "Delegation") and the worker's
own code (tiergate/sandbox/cgroup.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tiergate.jobsettings import JobsSettings

NOBODY = 65534
CGROUP = Path("/sys/fs/cgroup")
REPO = Path(__file__).resolve().parents[2]


V2 = (CGROUP / "cgroup.controllers").exists()
_DELEGATED_FILES = ("cgroup.procs", "cgroup.threads", "cgroup.subtree_control")


def controller_dirs(parent: str) -> list[Path]:
    """Where the cgroup parent named ``parent`` lives: one v2 directory, or one per v1
    controller the sandbox uses."""
    if V2:
        return [CGROUP / parent]
    return [CGROUP / c / parent for c in ("memory", "pids", "cpu")]


def _leaf(parent: str) -> Path:
    return CGROUP / parent / "worker"


def as_nobody(cgroup_parent: str | None = None) -> list[str]:
    """The command prefix that runs what follows as uid 65534: on v2, with a delegated
    ``cgroup_parent``, inside its ``worker`` leaf (the module's docstring)."""
    drop = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    if V2 and cgroup_parent is not None:
        procs = str(_leaf(cgroup_parent) / "cgroup.procs")
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', procs, *drop]
    return drop


@contextmanager
def delegated(jobs: JobsSettings) -> Iterator[JobsSettings]:
    """``jobs`` with a work directory and a cgroup parent owned by uid 65534."""
    assert os.geteuid() == 0, "delegating a cgroup to the unprivileged user needs root"
    parent = f"tiergate-delegated-{uuid.uuid4().hex[:8]}"
    dirs = controller_dirs(parent)
    work = Path(tempfile.mkdtemp(prefix="tiergate-unpriv-", dir="/tmp"))
    os.chown(work, NOBODY, NOBODY)
    work.chmod(0o755)
    for path in dirs:
        path.mkdir()
        os.chown(path, NOBODY, NOBODY)
    if V2:  # the controllers its children may use, its files, and the worker's leaf
        (CGROUP / "cgroup.subtree_control").write_text("+memory +pids +cpu")
        (dirs[0] / "cgroup.subtree_control").write_text("+memory +pids +cpu")
        _leaf(parent).mkdir()
        for owned in (
            *(dirs[0] / name for name in _DELEGATED_FILES),
            _leaf(parent),
            *(_leaf(parent) / name for name in _DELEGATED_FILES),
        ):
            os.chown(owned, NOBODY, NOBODY)
    tree = jobs.model_copy(deep=True)
    tree.sandbox.work_dir = str(work / "jobs")
    tree.sandbox.cgroup_parent = parent
    try:
        yield tree
    finally:
        for path in dirs:
            for child in [*path.glob("job-*"), path / "worker"]:
                if child.is_dir():
                    child.rmdir()
            if path.is_dir():
                path.rmdir()
        shutil.rmtree(work, ignore_errors=True)


@contextmanager
def memory_capped(proc: subprocess.Popen[bytes], jobs: JobsSettings, mb: int) -> Iterator[Path]:
    """``proc`` (a worker started by :func:`start_worker`) in a memory cgroup of ``mb`` MiB
    of its own, as a pod's memory limit holds it: whatever it allocates beyond that, the
    kernel kills it. Its jobs' processes leave it for their own cgroups (on v2 both are
    below the delegated parent, as the kernel requires for a move). Yields the cgroup."""
    if V2:  # the leaf it started in (as_nobody), made and removed by delegated()
        path = _leaf(jobs.sandbox.cgroup_parent)
        limit = "memory.max"
    else:
        path = CGROUP / "memory" / f"tiergate-worker-{uuid.uuid4().hex[:8]}"
        limit = "memory.limit_in_bytes"
        path.mkdir()
    try:
        (path / limit).write_text(str(mb * 1024 * 1024))
        (path / "cgroup.procs").write_text(str(proc.pid))
        yield path
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        if not V2:
            path.rmdir()


def start_worker(
    jobs: JobsSettings, log: Path, extra_env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``tiergate worker`` as uid 65534, configured by ``TIERGATE_JOBS``, with the storage
    keys of this process's environment and ``extra_env`` in its own."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": jobs.sandbox.work_dir,
        "TIERGATE_JOBS": jobs.model_dump_json(),
        **{k: v for k, v in os.environ.items() if k.startswith("AWS_")},
        **(extra_env or {}),
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [*as_nobody(jobs.sandbox.cgroup_parent), sys.executable, "-m", "tiergate", "worker"],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def run_as_nobody(
    script: str, *args: str, home: str, cgroup_parent: str | None = None, timeout: float = 300
) -> Any:
    """``python -c script REPO *args`` as uid 65534 (a worker's code run as the chart's
    worker would run it, in a process of its own, in ``cgroup_parent``'s leaf on v2); what
    it printed last, as JSON."""
    done = subprocess.run(
        [*as_nobody(cgroup_parent), sys.executable, "-c", script, str(REPO), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={"PATH": os.environ["PATH"], "HOME": home},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])
