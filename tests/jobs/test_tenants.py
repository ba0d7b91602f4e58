"""Hostile tenants, written as the attacker would: a job that goes looking for the worker's
secrets, a tenant that fails its own setup on purpose to trip a breaker other tenants share,
a fork bomb and disk and inode bombs beside a neighbour's job. The neighbour's work
finishes; the attacker reaches nothing and stops only itself. Real bubblewrap, a real
Kafka-protocol broker and a real S3 server."""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.jobs.tenants import tenants
from tests.jobstack import jobs_stack
from tests.waiting import eventually
from tiergate.jobs.state.breaker import BreakerBoard
from tiergate.jobs.state.store import JobStore
from tiergate.jobsettings import SandboxSettings
from tiergate.protocol import JobLimits
from tiergate.sandbox import Sandbox, SandboxError

ROOT = os.geteuid() == 0
ENDED = ("completed", "failed", "cancelled", "incomplete")
CANARY = f"canary-{uuid.uuid4().hex}"

# Everything a job can read of the processes it can see: environments, command lines,
# open files. Prints the worker variables' names it finds, and whether it could read pid
# 1's environment at all (the control: a scan that reads nothing would find nothing).
SCAN = (
    "for p in /proc/[0-9]*; do cat $p/environ $p/cmdline 2>/dev/null; echo; "
    "ls -l $p/fd 2>/dev/null; done | tr '\\0' '\\n' > /tmp/seen; "
    "grep -q '^PATH=' /tmp/seen && echo pid1-environ-readable; "
    "grep -o -E 'AWS_[A-Z_]+|TIERGATE_[A-Z_]+|canary-[0-9a-f]+' /tmp/seen | sort -u"
)
CLEAN = (
    f"{SCAN} > /tmp/found; grep -q pid1-environ-readable /tmp/found && "
    "test $(wc -l < /tmp/found) -eq 1"
)


def test_a_job_reads_no_worker_variable_from_any_process(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's probe, as a job's setup and as its verifier: the worker (here in this
    process) holds storage keys, the jobs settings and a canary in its environment; the job
    sees none of them in any /proc entry it can read."""
    monkeypatch.setenv("TIERGATE_SECRET_CANARY", CANARY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", os.environ.get("AWS_SECRET_ACCESS_KEY", CANARY))
    model.behaviour.replies = ["DONE"]
    with jobs_stack(broker, s3, model, tmp_path) as stack:
        stack.start_worker()
        body = {
            "model": MODEL,
            "instruction": "Say DONE.",
            "setup": [SCAN],
            "verifier": {"command": CLEAN},
            "limits": {"max_steps": 2, "timeout_seconds": 60},
        }
        job = stack.submit(body)
        done = stack.wait(job["id"], lambda j: j["status"] in ENDED, timeout=120)
        trajectory = httpx.get(done["artifacts"]["trajectory"]).text
    # What the job's commands printed (the commands themselves name what they look for).
    seen = "".join(json.loads(line).get("output", "") for line in trajectory.splitlines() if line)
    assert "pid1-environ-readable" in seen, trajectory
    for secret in (CANARY, "AWS_", "TIERGATE_", stack.jobs.storage.bucket):
        assert secret not in seen, (secret, trajectory)
    assert done["status"] == "completed", (done, trajectory)  # the verifier saw nothing


def test_one_tenant_failing_its_own_setup_does_not_stop_another(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    """Ten jobs of mallory's whose setup is ``false`` leave the shared ``default``
    environment's breaker closed (mallory counts once), and alice's job runs."""
    model.behaviour.replies = ["DONE"]
    keys = tenants("mallory", "alice")
    mallory, alice = keys.headers("mallory"), keys.headers("alice")
    failing = {
        "model": MODEL,
        "instruction": "Say DONE.",
        "setup": ["false"],
        "limits": {"max_steps": 2, "timeout_seconds": 30},
    }
    with jobs_stack(
        broker, s3, model, tmp_path, auth=keys.auth, worker={"api_key": keys.worker}
    ) as stack:
        stack.start_worker()
        ids = [stack.submit(failing, headers=mallory)["id"] for _ in range(10)]
        for job_id in ids:
            ended = stack.wait(job_id, lambda j: j["status"] in ENDED, timeout=120, headers=mallory)
            assert ended["error"]["code"] == "sandbox", ended
        breaker = BreakerBoard(JobStore(stack.jobs.storage), stack.jobs).read("default")[0]
        assert breaker.state == "closed" and breaker.failures == 1, breaker
        ordinary = {**failing, "setup": ["true"]}
        job = stack.submit(ordinary, headers=alice)
        done = stack.wait(job["id"], lambda j: j["status"] in ENDED, timeout=120, headers=alice)
        assert done["status"] in ("completed", "incomplete"), done


# -- the sandbox itself, two jobs side by side ----------------------------------------------


@pytest.fixture
def slots() -> Iterator[list[Sandbox]]:
    """Two sandboxes as two job slots of one worker make them (their own uids)."""
    base = SandboxSettings(work_dir="/tmp/tiergate-sandboxes/tenants", max_processes=400)
    boxes = [
        Sandbox(f"t{uuid.uuid4().hex[:8]}", JobLimits(timeout_seconds=60), base.for_slot(i))
        for i in range(2)
    ]
    yield boxes
    for box in boxes:
        box.close()


def test_each_job_slot_runs_as_a_user_of_its_own(slots: list[Sandbox]) -> None:
    ids = [box.run("id -u", timeout=20).output.strip() for box in slots]
    if ROOT:
        assert ids[0] != ids[1], ids
    else:  # an unprivileged worker's jobs run as the worker; its cgroup counts processes
        assert ids[0] == ids[1] == str(os.geteuid())


def test_a_fork_bomb_leaves_the_neighbour_room_to_fork(slots: list[Sandbox]) -> None:
    """The bomb fills its own process budget (400 here, out of RLIMIT_NPROC's 512 per
    uid); the neighbour, beside it, still starts 150 processes: had the two jobs shared a
    uid, the neighbour would have had 112."""
    bomb, neighbour = slots
    ended: dict[str, Any] = {}
    started = threading.Event()

    # A shell gives up at its first failed fork (and its children go with it); this holds
    # on to every process it made.
    bomb.write_files({"bomb.py": BOMB})

    def run_bomb() -> None:
        started.set()
        ended["bomb"] = bomb.run("python3 bomb.py", timeout=25)

    thread = threading.Thread(target=run_bomb)
    thread.start()
    started.wait(5)
    try:
        # Until the bomb holds its 400 processes, the neighbour's success proves nothing.
        # The bomb's cgroup says how many it holds.
        _wait_for_processes(bomb, 390)
        result = neighbour.run(
            "n=0; for i in $(seq 150); do sleep 5 & n=$((n+1)); done; wait; echo started=$n",
            timeout=30,
        )
    finally:
        bomb.kill()
        thread.join(30)
    assert result.exit_code == 0 and "started=150" in result.output, result.output
    assert "fork" not in result.output.lower(), result.output


BOMB = """
import os, time
while True:
    try:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
    except OSError:
        break
time.sleep(60)
"""


def _wait_for_processes(box: Sandbox, count: int, timeout: float = 20) -> None:
    eventually(
        lambda: box.process_count() >= count,
        timeout,
        0.1,
        lambda: f"the bomb holds {box.process_count()} processes, not {count}",
    )


def test_an_inode_bomb_is_stopped_while_it_runs(tmp_path: Path) -> None:
    settings = SandboxSettings(
        work_dir="/tmp/tiergate-sandboxes/tenants", max_workspace_entries=2000
    )
    box = Sandbox(f"t{uuid.uuid4().hex[:8]}", JobLimits(disk_mb=64), settings)
    try:
        with pytest.raises(SandboxError, match="more than 2000 files and directories"):
            box.run("python3 -c \"[open(f'f{i}', 'w').close() for i in range(10**7)]\"", timeout=60)
        assert sum(1 for _ in box.workspace.iterdir()) < 100_000
    finally:
        box.close()


def test_a_disk_bomb_under_the_file_size_limit_is_stopped_while_it_runs() -> None:
    """Many files each under RLIMIT_FSIZE (the disk limit) together over the disk limit:
    stopped during the command, not after it, with the limit named."""
    settings = SandboxSettings(work_dir="/tmp/tiergate-sandboxes/tenants")
    box = Sandbox(f"t{uuid.uuid4().hex[:8]}", JobLimits(disk_mb=16), settings)
    try:
        with pytest.raises(SandboxError, match="over the job's disk limit of 16777216 bytes"):
            box.run(
                "i=0; while true; do head -c 4000000 /dev/zero > f$i; i=$((i+1)); sleep 0.02; done",
                timeout=60,
            )
        used = sum(p.stat().st_size for p in box.workspace.iterdir())
        assert used < 16 * 1024 * 1024 + 400 * 1024 * 1024, used
    finally:
        box.close()
