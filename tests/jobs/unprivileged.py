"""A worker process as the image's unprivileged user (uid 65534), with a cgroup parent
delegated to it the way an operator would (chown of the parent under each v1 controller,
or of a v2 directory), for the tests that must hold as that user."""

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


def _controller_dirs(parent: str) -> list[Path]:
    if (CGROUP / "cgroup.controllers").exists():
        return [CGROUP / parent]
    return [CGROUP / c / parent for c in ("memory", "pids", "cpu")]


@contextmanager
def delegated(jobs: JobsSettings) -> Iterator[JobsSettings]:
    """``jobs`` with a work directory and a cgroup parent owned by uid 65534."""
    assert os.geteuid() == 0, "delegating a cgroup to the unprivileged user needs root"
    parent = f"tiergate-delegated-{uuid.uuid4().hex[:8]}"
    dirs = _controller_dirs(parent)
    work = Path(tempfile.mkdtemp(prefix="tiergate-unpriv-", dir="/tmp"))
    os.chown(work, NOBODY, NOBODY)
    work.chmod(0o755)
    for path in dirs:
        path.mkdir()
        os.chown(path, NOBODY, NOBODY)
        if path.parent == CGROUP:  # v2: the controllers its children may use
            (CGROUP / "cgroup.subtree_control").write_text("+memory +pids +cpu")
            (path / "cgroup.subtree_control").write_text("+memory +pids +cpu")
    tree = jobs.model_copy(deep=True)
    tree.sandbox.work_dir = str(work / "jobs")
    tree.sandbox.cgroup_parent = parent
    try:
        yield tree
    finally:
        for path in dirs:
            for child in path.glob("job-*"):
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
    if (CGROUP / "cgroup.controllers").exists():
        path = CGROUP / jobs.sandbox.cgroup_parent / "worker"
        limit, procs = "memory.max", "cgroup.procs"
    else:
        path = CGROUP / "memory" / f"tiergate-worker-{uuid.uuid4().hex[:8]}"
        limit, procs = "memory.limit_in_bytes", "cgroup.procs"
    path.mkdir()
    try:
        (path / limit).write_text(str(mb * 1024 * 1024))
        (path / procs).write_text(str(proc.pid))
        yield path
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
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
            [
                *("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"),
                *(sys.executable, "-m", "tiergate", "worker"),
            ],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def run_as_nobody(script: str, *args: str, home: str, timeout: float = 300) -> Any:
    """``python -c script REPO *args`` as uid 65534 (a worker's code run as the chart's
    worker would run it, in a process of its own); what it printed last, as JSON."""
    done = subprocess.run(
        [
            *("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"),
            *(sys.executable, "-c", script, str(REPO), *args),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={"PATH": os.environ["PATH"], "HOME": home},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])
