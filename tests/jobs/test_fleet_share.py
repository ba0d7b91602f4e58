"""Each key's share of the fleet (issue 33, item 3; tiergate/jobs/state/share.py): one key's
backlog of long jobs filled every slot for as long as it lasted. Two keys here, one
worker of four slots, ``jobs.fleet_share`` 0.5: the first key alone uses all four; once
the second's jobs wait, the first holds at most two while they do, its jobs over the
share wait with the reason on their record, and every job of both runs once. Real broker,
store and sandbox; a fake model (named as one) whose reply runs each job's script."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.jobs.tenants import tenants
from tests.jobstack import JobsStack, jobs_stack
from tests.waiting import eventually
from tiergate.jobs.state.store import JobStore

SLOTS, SHARE, EACH = 4, 0.5, 10
ENDED = ("completed", "failed", "cancelled", "incomplete")
TASK: dict[str, Any] = {
    "model": MODEL,
    "instruction": "run the task",
    "limits": {"max_steps": 1, "timeout_seconds": 60},
    "workspace": {"files": {"task.sh": "sleep 3 && touch done"}},
    "verifier": {"command": "test -f done"},
}


def _statuses(stack: JobsStack, headers: dict[str, str]) -> dict[str, dict[str, Any]]:
    resp = httpx.get(f"{stack.base}/v1/jobs?limit=100", headers=headers, timeout=10)
    return {job["id"]: job for job in resp.json()["data"]}


def test_a_key_holds_its_share_of_the_fleet_while_another_waits(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    model.behaviour.replies = ["```bash\nsh task.sh\n```"]
    keys = tenants("alice", "bob")
    jobs = {
        "fleet_share": SHARE,
        "fleet_share_retry_seconds": 1.0,
        "fleet_share_refresh_seconds": 0.5,
        "kafka": {"partitions": 1},
    }
    alice, bob = keys.headers("alice"), keys.headers("bob")
    with jobs_stack(
        broker, s3, model, tmp_path, auth=keys.auth, jobs=jobs, worker={"api_key": keys.worker}
    ) as stack:
        stack.start_worker(concurrency=SLOTS)
        for _ in range(EACH):
            stack.submit(TASK, headers=alice)
        # Alone, alice uses the whole fleet.
        eventually(
            lambda: (
                sum(j["status"] == "in_progress" for j in _statuses(stack, alice).values()) == SLOTS
            ),
            60,
            0.2,
            "alice's jobs on every slot",
        )
        bobs = [stack.submit(TASK, headers=bob)["id"] for _ in range(EACH)]
        submitted = time.monotonic()
        samples: list[tuple[float, int, int, int]] = []  # (seconds, alice's, bob's, bob waits)
        reasons: set[str] = set()
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                mine, theirs = _statuses(stack, alice), _statuses(stack, bob)
                running = [
                    sum(j["status"] == "in_progress" for j in side.values())
                    for side in (mine, theirs)
                ]
                waiting = sum(j["status"] == "queued" for j in theirs.values())
                samples.append((time.monotonic() - submitted, *running, waiting))
                reasons.update((j.get("error") or {}).get("code", "") for j in mine.values())
                stop.wait(0.25)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            for job_id in bobs:
                stack.wait(job_id, lambda j: j["status"] in ENDED, timeout=180, headers=bob)
        finally:
            stop.set()
            sampler.join(30)
        alices = list(_statuses(stack, alice))
        for job_id in alices:
            stack.wait(job_id, lambda j: j["status"] in ENDED, timeout=180, headers=alice)
        said = [
            e
            for job_id in alices
            for e in JobStore(stack.jobs.storage).events(job_id, 0)
            if e.get("type") == "job.waiting"
        ]

    cap = math.ceil(SHARE * SLOTS)
    # Once alice's first jobs (3 s each) have ended, she holds at most her share while bob
    # waits; bob gets the rest of the fleet.
    settled = [s for s in samples if s[0] > 8 and s[3] > 0]
    assert settled, samples
    assert max(s[1] for s in settled) <= cap, settled
    assert max(s[2] for s in settled) >= SLOTS - cap, settled
    assert "fleet_share" in reasons, (reasons, said[:2], [s for s in samples if s[0] > 2][:12])
    store = JobStore(stack.jobs.storage)
    every = [*_statuses_ended(store, bobs)]
    assert all(store.deliveries(job_id) == 1 for job_id in every)


def _statuses_ended(store: JobStore, ids: list[str]) -> list[str]:
    for job_id in ids:
        final = store.final(job_id)
        assert final is not None and final.status.value in ENDED, job_id
    return ids
