"""A job that takes its own permission bits away, on a non-root worker (the chart's: the
worker and its jobs share one uid), as issue 33 saw it: a ``d-wx`` directory written into
hid 60 MiB from the disk watch (it saw 4 KiB) and from the between-command check (0 B) and
survived the cleanup; a mode-000 file failed the job's artifact after its verifier passed.
Here the worker gives itself its owner's bits back (tiergate.sandbox.owned): the bytes are
counted, the command stopped at the disk limit, the artifact holds the file, the workspace
is removed. Real bubblewrap, as uid 65534 with a delegated cgroup parent, in a process of
its own."""

from __future__ import annotations

import os

import pytest

from tests.jobs.unprivileged import NOBODY, delegated, run_as_nobody
from tiergate.jobsettings import JobsSettings

ROOT = os.geteuid() == 0

_AS_WORKER = r"""
import json, os, sys, tarfile
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from tiergate.protocol import JobLimits
from tiergate.sandbox import Sandbox, SandboxError
from tiergate.jobsettings import SandboxSettings

settings = SandboxSettings.model_validate_json(sys.argv[2])
out = {"uid": os.geteuid()}

# Three files of 10 MB in a directory the job then makes d-wx: 30 MB against 16 MiB.
box = Sandbox("hide-watch", JobLimits(disk_mb=16), settings)
try:
    try:
        box.run(
            "mkdir h && chmod 300 h && for i in 1 2 3; do head -c 10000000 /dev/zero > h/f$i; "
            "chmod 300 h; sleep 0.5; done; sleep 5",
            timeout=60,
        )
        out["watch"] = "not stopped"
    except SandboxError as exc:
        out["watch"] = str(exc)
finally:
    box.close()
out["watch_removed"] = not box.root.exists()

# 18 MB, then hidden: the check between commands, against 16 MiB (the command itself ran
# under 64 MiB, so that the watch, which may look while it runs, never stops it first).
box = Sandbox("hide-check", JobLimits(disk_mb=64), settings)
try:
    box.run("mkdir h && head -c 9000000 /dev/zero > h/a && head -c 9000000 /dev/zero > h/b "
            "&& chmod 300 h", timeout=60)
    try:
        out["check"] = box.check_disk(16 * 1024 * 1024)
    except SandboxError as exc:
        out["check"] = str(exc)
    # A mode-000 file and a mode-000 directory with a file in it: into the artifact.
    box.run("rm -rf h; echo secret > locked.txt && chmod 000 locked.txt && mkdir -p d/e && "
            "echo in > d/e/f && chmod 000 d/e d", timeout=30)
    artifact = box.archive()
    with tarfile.open(artifact) as tar:
        out["artifact"] = sorted(tar.getnames())
        member = tar.extractfile("workspace/locked.txt")
        out["locked"] = member.read().decode() if member else None
finally:
    box.close()
out["check_removed"] = not box.root.exists()
print(json.dumps(out))
"""


@pytest.mark.skipif(not ROOT, reason="needs root to become uid 65534 (CI runs as root)")
def test_locked_directories_hide_nothing_from_a_non_root_worker() -> None:
    with delegated(JobsSettings()) as jobs:
        os.makedirs(jobs.sandbox.work_dir, exist_ok=True)
        os.chown(jobs.sandbox.work_dir, NOBODY, NOBODY)
        out = run_as_nobody(
            _AS_WORKER,
            jobs.sandbox.model_dump_json(),
            home=jobs.sandbox.work_dir,
            cgroup_parent=jobs.sandbox.cgroup_parent,
        )
    assert out["uid"] == NOBODY
    assert "over the job's disk limit of 16777216 bytes" in out["watch"], out
    assert out["watch_removed"], "a d-wx directory survived the cleanup"
    assert isinstance(out["check"], str) and "over the job's disk limit" in out["check"], out
    assert "workspace/locked.txt" in out["artifact"] and out["locked"] == "secret\n", out
    assert "workspace/d/e/f" in out["artifact"], out
    assert out["check_removed"], "a mode-000 directory survived the cleanup"
