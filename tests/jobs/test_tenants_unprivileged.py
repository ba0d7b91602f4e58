"""Two tenants' jobs side by side on the chart's kind of worker: ``tiergate worker`` as an
unprivileged user (uid 65534) with a delegated cgroup parent, where every job runs as the
worker's own uid. What keeps them apart there is not a uid but each job's namespaces (its
own user, mount, PID, IPC, UTS and network namespaces, bubblewrap's ``--unshare-all``) and
cgroup; these tests are the attacker's, with everything the attacker could know handed to
it: the victim's workspace path on the host, the worker's work directory, its variables'
names. Real bubblewrap, a real Kafka-protocol broker, a real S3 server, a fake model
(tests.fakes.fake_vllm)."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.jobs.tenants import Tenants, tenants
from tests.jobs.unprivileged import CGROUP, delegated, start_worker
from tests.jobstack import JobsStack, jobs_stack
from tests.servers import free_port
from tests.waiting import eventually
from tiergate.jobsettings import JobsSettings

ENDED = ("completed", "failed", "cancelled", "incomplete")
CANARY = f"canary-{uuid.uuid4().hex}"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root to become uid 65534 (CI runs as root)"
)

# The victim's setup: a secret in its workspace, then wait (the test says "go" by making a
# file there from the host) and check the secret is still whole: were its processes
# killed or its file changed by the neighbour, the setup fails and so does the job.
WAIT_FOR_GO = "while [ ! -f go ]; do sleep 0.1; done"


@contextmanager
def unprivileged_stack(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path, keys: Tenants, **sandbox: Any
) -> Iterator[tuple[JobsStack, JobsSettings]]:
    """A gateway with two tenants and one worker of two slots as uid 65534, whose
    environment holds the storage keys and :data:`CANARY`. Yields the stack and the
    worker's settings (its work directory and cgroup parent)."""
    model.behaviour.replies = ["DONE"]
    with (
        jobs_stack(
            broker,
            s3,
            model,
            tmp_path,
            auth=keys.auth,
            jobs={"sandbox": sandbox},
            # Its health port of its own (a stack on this machine may hold the default).
            worker={
                "api_key": keys.worker,
                "concurrency": 2,
                "metrics_host": "127.0.0.1",
                "metrics_port": free_port(),
            },
        ) as stack,
        delegated(stack.jobs) as unprivileged,
    ):
        log = tmp_path / "worker.log"
        worker = start_worker(
            unprivileged,
            log,
            {
                "TIERGATE_SECRET_CANARY": CANARY,
                "AWS_SECRET_ACCESS_KEY": os.environ.get("AWS_SECRET_ACCESS_KEY", CANARY),
            },
        )
        try:
            yield stack, unprivileged
            assert worker.poll() is None, log.read_text()[-3000:]
        finally:
            worker.terminate()
            worker.wait(30)


def _workspace(work_dir: Path, job_id: str) -> Path:
    """A running job's workspace on the host (the worker names it ``<id>.<pid>-<uid>``)."""

    def found() -> Path | None:
        hits = [p / "workspace" for p in work_dir.glob(f"{job_id}.*")]
        return hits[0] if hits and (hits[0] / "started").exists() else None

    workspace = eventually(found, 120, 0.1, f"job {job_id}'s setup running on the worker")
    assert workspace is not None
    return workspace


def _outputs(job: dict[str, Any]) -> str:
    """What the job's commands printed (a job that failed its setup: its error)."""
    if "trajectory" not in job["artifacts"]:
        return json.dumps(job["error"])
    trajectory = httpx.get(job["artifacts"]["trajectory"]).text
    lines = (json.loads(line) for line in trajectory.splitlines() if line)
    return "".join(step.get("output", "") for step in lines)


def _job(setup: list[str], verifier: str, timeout: int = 120) -> dict[str, Any]:
    return {
        "model": MODEL,
        "instruction": "Say DONE.",
        "setup": setup,
        "verifier": {"command": verifier},
        "limits": {"max_steps": 2, "timeout_seconds": timeout},
    }


def test_a_neighbour_on_a_non_root_worker_reaches_nothing_of_a_running_job(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    """Mallory's job runs while Alice's holds a secret in its workspace, and is told where
    that workspace is on the host: it reads nothing of it, writes nothing into it, sees
    none of Alice's processes (whose command lines hold the secret) and kills none of them
    with ``kill -9 -1``, and finds no worker variable in any process it can see. Alice's
    job then completes, its secret whole."""
    keys = tenants("alice", "mallory")
    secret = f"ALICE-SECRET-{uuid.uuid4().hex}"
    victim = _job(
        [
            f"echo {secret} > secret.txt && touch started && {WAIT_FOR_GO} && "
            f"grep -qx {secret} secret.txt"
        ],
        f"grep -qx {secret} secret.txt && test $(ls | wc -l) -eq 3",
    )
    with unprivileged_stack(broker, s3, model, tmp_path, keys) as (stack, worker):
        work_dir = Path(worker.sandbox.work_dir)
        alice = stack.submit(victim, headers=keys.headers("alice"))
        workspace = _workspace(work_dir, alice["id"])
        assert (workspace / "secret.txt").read_text() == f"{secret}\n"
        target = workspace / "secret.txt"
        attack = " ; ".join(
            [
                "touch started",
                f"cat {target} {work_dir}/*/workspace/secret.txt",
                f"echo mallory >> {target}",
                f"ls -la {work_dir} {workspace}",
                # The whole file system it can see, for Alice's secret (not /proc: its own
                # command line names the pattern; not /usr: the host's, bound read-only into
                # every job, where no job can write, and 5 GB whose reading from a cold disk
                # outlasted the job's time limit in CI).
                "grep -rIl ALICE-SECRET- / --exclude-dir=proc --exclude-dir=sys"
                " --exclude-dir=usr | head",
                # Every process it can see, by command line (Alice's holds the secret).
                "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done",
                # (Each marker the test looks for is spelt so that the attack's own command
                # line, which the scan above prints, does not hold it.)
                "echo processes-$((6*7))=$(ls -d /proc/[0-9]* | wc -l)",
                # The environment of every process it can see (its own shell's has PATH: the
                # control that the scan reads at all), for the worker's variables.
                "for p in /proc/[0-9]*; do cat $p/environ; echo; done | tr '\\0' '\\n' > /tmp/env",
                "grep -q ^PATH= /tmp/env && echo environ-$((6*7))-readable",
                "cat /tmp/env",
                "kill -9 -1",
                "echo attack-$((6*7))-done",
            ]
        )
        mallory = stack.submit(_job([attack], "true"), headers=keys.headers("mallory"))
        headers = keys.headers("mallory")
        # Longer than the job's own limit (120 s): a slow attack ends as the job's timeout,
        # with its outputs, not as this wait's.
        ended = stack.wait(mallory["id"], lambda j: j["status"] in ENDED, 180, headers)
        seen = _outputs(ended)
        for control in ("attack-42-done", "processes-42=", "environ-42-readable"):
            assert control in seen, (control, seen)
        # While Alice's job still runs: her file as she wrote it, her job not ended.
        assert target.read_text() == f"{secret}\n"
        assert sorted(os.listdir(workspace)) == ["secret.txt", "started"]
        running = httpx.get(f"{stack.base}/v1/jobs/{alice['id']}", headers=keys.headers("alice"))
        assert running.json()["status"] == "in_progress", running.text
        (workspace / "go").touch()
        done = stack.wait(alice["id"], lambda j: j["status"] in ENDED, 120, keys.headers("alice"))
    assert secret not in seen, seen
    # What the worker's environment holds, by value (the attack's own text names none).
    held = (CANARY, "TIERGATE_JOBS=", "AWS_SECRET_ACCESS_KEY=", stack.jobs.kafka.topic)
    for value in (*held, stack.jobs.storage.bucket):
        assert value not in seen, (value, seen)
    # Mallory's job saw its own processes (the scan read something), and only those.
    assert int(seen.split("processes-42=")[1].split()[0]) < 10, seen
    assert done["status"] == "completed", (done, _outputs(done))


def _pids_current(job_id: str, parent: str) -> int:
    """Processes in the job's cgroup (cgroup v2, or v1's pids controller), 0 before it."""
    base = CGROUP / parent if (CGROUP / "cgroup.controllers").exists() else CGROUP / "pids" / parent
    counts = [int((p / "pids.current").read_text()) for p in base.glob("job-*")]
    return max(counts, default=0)


def test_a_fork_bomb_on_a_non_root_worker_leaves_the_neighbour_room_to_fork(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    """Both jobs run as the worker's uid, so no per-uid limit may stand between them: the
    bomb holds its job's whole process budget (400 here) and Alice's job, started beside
    it, still starts 150 processes."""
    keys = tenants("alice", "mallory")
    bomb = (
        'touch started && python3 -c "\nimport os, time\nwhile True:\n  try:\n'
        "    if os.fork() == 0:\n      time.sleep(120); os._exit(0)\n"
        '  except OSError:\n    break\ntime.sleep(120)\n"'
    )
    neighbour = _job(
        [
            f"touch started && {WAIT_FOR_GO} && n=0; for i in $(seq 150); do sleep 3 & "
            "n=$((n+1)); done; wait; echo started=$n > forked"
        ],
        "grep -qx started=150 forked",
    )
    with unprivileged_stack(broker, s3, model, tmp_path, keys, max_processes=400) as (
        stack,
        worker,
    ):
        work_dir, parent = Path(worker.sandbox.work_dir), worker.sandbox.cgroup_parent
        bomber = stack.submit(_job([bomb], "true", timeout=60), headers=keys.headers("mallory"))
        _workspace(work_dir, bomber["id"])
        eventually(
            lambda: _pids_current(bomber["id"], parent) >= 390,
            60,
            0.2,
            lambda: f"the bomb holds {_pids_current(bomber['id'], parent)} processes, not 390",
        )
        alice = stack.submit(neighbour, headers=keys.headers("alice"))
        (_workspace(work_dir, alice["id"]) / "go").touch()
        done = stack.wait(alice["id"], lambda j: j["status"] in ENDED, 120, keys.headers("alice"))
        # The bomb still held its processes while Alice's job forked and ended.
        assert _pids_current(bomber["id"], parent) >= 390
        mallory = keys.headers("mallory")
        httpx.post(f"{stack.base}/v1/jobs/{bomber['id']}/cancel", headers=mallory)
        stack.wait(bomber["id"], lambda j: j["status"] in ENDED, 120, mallory)
    assert done["status"] == "completed", (done, _outputs(done))
