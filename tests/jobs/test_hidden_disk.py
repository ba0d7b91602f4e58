"""Disk a job holds where no walk of its workspace sees it: files it removed but keeps
open, or keeps mapped, fill the disk as any file does, yet a directory walk counts
nothing of them. Each is stopped while it runs, with the limit named, on a root worker
(this process, as CI runs) and on a non-root one (uid 65534 with a delegated cgroup, in a
process of its own). Real bubblewrap."""

from __future__ import annotations

import json
import os
import uuid

import pytest

from tests.jobs.unprivileged import NOBODY, delegated, run_as_nobody
from tiergate.jobsettings import JobsSettings, SandboxSettings
from tiergate.protocol import JobLimits
from tiergate.sandbox import Sandbox, SandboxError

# Ten files of 4 MB (under RLIMIT_FSIZE's 16 MiB each, 40 MB together against 16 MiB),
# each removed as soon as it is written; the process keeps them open, or only mapped.
UNLINKED_OPEN = """
import os, time
held = []
for i in range(10):
    f = open(f"f{i}", "wb"); f.write(b"x" * 4_000_000); f.flush(); os.unlink(f"f{i}")
    held.append(f); time.sleep(0.1)
time.sleep(30)
"""
UNLINKED_MAPPED = """
import mmap, os, time
held = []
for i in range(10):
    with open(f"f{i}", "wb+") as f:
        f.write(b"x" * 4_000_000); f.flush()
        held.append(mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED))
    os.unlink(f"f{i}"); time.sleep(0.1)
time.sleep(30)
"""
BOMBS = {"open": UNLINKED_OPEN, "mapped": UNLINKED_MAPPED}
LIMIT = "over the job's disk limit of 16777216 bytes"

_AS_WORKER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from tiergate.protocol import JobLimits
from tiergate.sandbox import Sandbox, SandboxError
from tiergate.jobsettings import SandboxSettings

settings = SandboxSettings.model_validate_json(sys.argv[2])
out = {}
for name, script in json.loads(sys.argv[3]).items():
    box = Sandbox(f"hidden-{name}", JobLimits(disk_mb=16), settings)
    try:
        box.write_files({"bomb.py": script})
        try:
            box.run("python3 bomb.py", timeout=60)
            out[name] = "not stopped"
        except SandboxError as exc:
            out[name] = str(exc)
    finally:
        box.close()
print(json.dumps(out))
"""


@pytest.mark.parametrize("bomb", sorted(BOMBS))
def test_removed_files_a_job_still_holds_count_against_its_disk(bomb: str) -> None:
    settings = SandboxSettings(work_dir="/tmp/tiergate-sandboxes/hidden-disk")
    box = Sandbox(f"h{uuid.uuid4().hex[:8]}", JobLimits(disk_mb=16), settings)
    try:
        box.write_files({"bomb.py": BOMBS[bomb]})
        with pytest.raises(SandboxError, match=LIMIT):
            box.run("python3 bomb.py", timeout=60)
    finally:
        box.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become uid 65534 (CI runs as root)")
def test_removed_files_count_on_a_non_root_worker_too() -> None:
    with delegated(JobsSettings()) as jobs:
        os.makedirs(jobs.sandbox.work_dir, exist_ok=True)
        os.chown(jobs.sandbox.work_dir, NOBODY, NOBODY)
        settings = jobs.sandbox.model_dump_json()
        out = run_as_nobody(
            _AS_WORKER,
            settings,
            json.dumps(BOMBS),
            home=jobs.sandbox.work_dir,
            cgroup_parent=jobs.sandbox.cgroup_parent,
        )
    for name in BOMBS:
        assert LIMIT in out[name], out
