"""Rollout batches as a trainer takes them (issue 51), end to end (real broker, object
store and sandbox; the model is the fake): groups stream while a slow task still runs and
no task waits for another's round; each group reaches the trainer once through killed
workers; a trainer's policy version is recorded and only goes forward."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.jobs.test_batches import MIXED, REPLY, _stack, task
from tests.jobs.workerfleet import fleet
from tests.jobstack import jobs_stack
from tiergate.jobsclient import JobsClient


def test_a_slow_task_never_delays_another_tasks_next_samples_and_groups_stream_at_once(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    """Issue 51: rounds were batch-wide, so a quick task's next samples waited for the
    slowest rollout of the round while slots idled. Each task now goes on alone: while the
    slow task's rollouts still run, the quick tasks' round 2 has started (the round barrier,
    schedule: rounds, would have started none of it before the slow ones ended). And a
    trainer takes each complete group (a task's samples of one round) once, while the
    batch runs, from the paged JSON lines or the Server-Sent Events, resuming after the
    last it took."""
    quick = [task("quick", f"q{i}", MIXED) for i in range(4)]  # all 4 saturated: 1 in 256
    tasks = [*quick, task("slow", "s", "sleep 25; touch ok")]
    with _stack(broker, s3, model, tmp_path) as stack:  # two slots
        stack.start_worker()
        with JobsClient(stack.base) as client:
            batch = client.submit_batch(
                tasks,
                samples_per_task=3,
                rounds=2,
                max_in_flight=4,
                domain_weights={"quick": 3, "slow": 1},  # slow holds one slot at most
            )
            taken = [
                (g, time.time()) for g in client.groups(batch.id, poll_seconds=0.5, timeout=300)
            ]
            final = client.wait_batch(batch.id, timeout=60, poll_seconds=0.5)
            assert final.schedule == "per_task"
            slow_ended = max(
                client.get(r.job_id).completed_at or 0 for r in final.rollouts if r.domain == "slow"
            )
            second = [r for r in final.rollouts if r.domain == "quick" and r.round == 2]
            assert second, "every quick task saturated in round 1 (1 in 256): run again"
            first_second = min(client.get(r.job_id).created_at for r in second)
        resumed = _group_events(stack.base, batch.id, last_event_id=2)
    assert first_second < slow_ended - 5, (first_second, slow_ended)
    assert final.status == "completed"
    # Every group once, in order, each with its round's samples; the first ones taken
    # while the slow task still ran.
    rounds = {(r.task_id, r.round) for r in final.rollouts}
    assert [g["seq"] for g, _ in taken] == list(range(1, len(rounds) + 1))
    assert {(g["task_id"], g["round"]) for g, _ in taken} == rounds
    for group, _ in taken:
        ids = {s["job_id"] for s in group["samples"]}
        assert ids == {
            r.job_id
            for r in final.rollouts
            if (r.task_id, r.round) == (group["task_id"], group["round"])
        }
        assert all(s["messages"] for s in group["samples"])  # each sample's conversation
    assert taken[0][1] < slow_ended - 5, (taken[0][1], slow_ended)
    # The events resume after Last-Event-ID: the groups after the second, then the end.
    assert [e.get("seq") for e in resumed[:-1]] == [g["seq"] for g, _ in taken[2:]]
    assert resumed[-1]["type"] == "batch.completed"


def _group_events(base: str, batch_id: str, last_event_id: int) -> list[dict[str, Any]]:
    events = []
    url = f"{base}/v1/jobs/batches/{batch_id}/groups/events"
    headers = {"last-event-id": str(last_event_id)}
    with httpx.stream("GET", url, headers=headers, timeout=60) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                break
            events.append(json.loads(line[len("data: ") :]))
    return events


def test_each_group_reaches_the_trainer_once_through_killed_workers(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    """Issue 51: the groups a trainer takes while the batch runs, each once, when every
    worker (the one scheduling the batch among them) is killed mid-batch and a new one
    takes over the batch's scheduler and its jobs."""
    model.behaviour.replies = [REPLY]
    tasks = [task("d", f"t{i}", "sleep 1; " + MIXED) for i in range(6)]
    with (
        jobs_stack(broker, s3, model, tmp_path, jobs={"batch_poll_seconds": 0.3}) as stack,
        fleet(stack, tmp_path, lease_seconds=4, concurrency=2) as workers,
    ):
        first, second = workers.start(), workers.start()
        with JobsClient(stack.base) as client:
            batch = client.submit_batch(tasks, samples_per_task=2, rounds=2, max_in_flight=4)
            taken = []
            for group in client.groups(batch.id, poll_seconds=0.3, timeout=300):
                taken.append(group)
                if len(taken) == 2:
                    workers.kill(first.pid)
                    workers.kill(second.pid)
                    workers.start()
            final = client.wait_batch(batch.id, timeout=60, poll_seconds=0.5)
    assert final.status == "completed"
    rounds = {(r.task_id, r.round) for r in final.rollouts}
    assert [g["seq"] for g in taken] == list(range(1, len(rounds) + 1))
    assert sorted((g["task_id"], g["round"]) for g in taken) == sorted(rounds)


def test_a_trainers_policy_version_is_recorded_and_only_goes_forward(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    """Issue 51: no rollout said which policy produced it. A trainer announces the
    version the model serves now; the rollouts started after it record it, each with its
    model; a version lower than the batch's is a 400."""
    tasks = [task("d", f"t{i}", "sleep 2; touch ok") for i in range(3)]
    with _stack(broker, s3, model, tmp_path) as stack:
        stack.start_worker()
        url = f"{stack.base}/v1/jobs/batches"
        with JobsClient(stack.base) as client:
            batch = client.submit_batch(tasks, samples_per_task=2, max_in_flight=1)
            said = httpx.post(f"{url}/{batch.id}/policy_version", json={"version": 3}, timeout=30)
            assert said.status_code == 200, said.text
            assert said.json()["version"] == 3
            behind = httpx.post(f"{url}/{batch.id}/policy_version", json={"version": 2}, timeout=30)
            assert behind.status_code == 400, behind.text
            assert behind.json()["error"]["code"] == "policy_version_behind"
            bad = httpx.post(f"{url}/{batch.id}/policy_version", json={"version": -1}, timeout=30)
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "version"
            final = client.wait_batch(batch.id, timeout=240, poll_seconds=0.5)
    versions = [r.policy_version for r in final.rollouts]
    assert final.policy_version == 3 and versions[-1] == 3, versions
    assert set(versions) <= {0, 3} and versions == sorted(versions)  # in the order started
    assert {r.model for r in final.rollouts} == {MODEL}
