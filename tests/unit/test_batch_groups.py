"""Groups a trainer takes while the batch runs (tiergate/jobs/batches/groups.py): a task's
round is a group once all its samples ended, recorded once, numbered in the order they
completed; its samples' rewards normalized within the group, against hand-computed values."""

from __future__ import annotations

import pytest

from tiergate.jobs.batches.groups import close, members, record
from tiergate.protocol.batches import Batch, BatchCreate, Rollout


def _spec() -> BatchCreate:
    tasks = [{"model": "m", "instruction": "x", "domain": "d", "task_id": t} for t in ("a", "b")]
    return BatchCreate.model_validate({"tasks": tasks, "samples_per_task": 2, "rounds": 2})


def _r(task: str, sample: int, round_: int, status: str, reward: float | None = None) -> Rollout:
    return Rollout(
        job_id=f"{task}-{sample}",
        domain="d",
        task_id=task,
        sample=sample,
        round=round_,
        status=status,
        passed=None if reward is None else reward > 0.5,
        reward=reward,
    )


def test_a_round_is_a_group_once_all_its_samples_ended_and_only_once() -> None:
    spec = _spec()
    batch = Batch(id="batch_x", owner="o", created_at=0, samples_per_task=2, rounds=2)
    batch.rollouts = [_r("a", 0, 1, "completed", 1.0), _r("a", 1, 1, "running")]
    batch.rollouts += [_r("b", 0, 1, "completed", 0.0), _r("b", 1, 1, "failed")]
    assert [(g.task_id, g.round, g.seq) for g in close(spec, batch, 10.0)] == [("b", 1, 1)]
    assert close(spec, batch, 11.0) == []  # recorded once
    batch.rollouts[1].status, batch.rollouts[1].reward = "completed", 0.0
    batch.rollouts.append(_r("a", 2, 2, "completed", 1.0))  # a's round 2: 1 of 2 started
    assert [(g.task_id, g.round, g.seq) for g in close(spec, batch, 12.0)] == [("a", 1, 2)]
    # The batch ends (its budget spent) before a's round 2 started its second sample.
    batch.status = "completed"
    closed = close(spec, batch, 13.0)
    assert [(g.task_id, g.round, g.seq, g.completed_at) for g in closed] == [("a", 2, 3, 13.0)]
    assert [g.seq for g in batch.groups] == [1, 2, 3]


def test_a_groups_rewards_are_normalized_within_it() -> None:
    batch = Batch(id="batch_x", owner="o", created_at=0, samples_per_task=3, rounds=1)
    batch.rollouts = [
        _r("a", 0, 1, "completed", 1.0),
        _r("a", 1, 1, "completed", 0.0),
        _r("a", 2, 1, "failed"),  # no verdict: no part in the figures
        _r("b", 0, 1, "completed", 0.25),  # another task: not in a's group
    ]
    spec = BatchCreate.model_validate(
        {
            "tasks": [
                {"model": "m", "instruction": "x", "domain": "d", "task_id": t} for t in "ab"
            ],
            "samples_per_task": 3,
        }
    )
    ref = close(spec, batch, 5.0)[0]
    rollouts = members(batch, ref)
    body = record(ref, rollouts, [{"job_id": r.job_id} for r in rollouts])
    assert (body["seq"], body["task_id"], body["scored"], body["passed"]) == (1, "a", 2, 1)
    assert body["reward_mean"] == pytest.approx(0.5) and body["reward_std"] == pytest.approx(0.5)
    figures = [
        (s["job_id"], s["group_advantage"], s["group_reward_normalized"]) for s in body["samples"]
    ]
    assert figures[0] == ("a-0", pytest.approx(0.5), pytest.approx(1.0, rel=1e-5))
    assert figures[1] == ("a-1", pytest.approx(-0.5), pytest.approx(-1.0, rel=1e-5))
    assert figures[2] == ("a-2", None, None)


def test_each_named_reward_is_normalized_within_the_group_on_its_own() -> None:
    batch = Batch(id="batch_x", owner="o", created_at=0, samples_per_task=3, rounds=1)
    batch.rollouts = [
        _r("a", 0, 1, "completed", 1.5),
        _r("a", 1, 1, "completed", 0.5),
        _r("a", 2, 1, "completed", 1.0),
    ]
    # correct: 1, 0, 1 (0-1); style: 0.5, 0.5, 0 (another scale); one sample wrote no style.
    batch.rollouts[0].rewards = {"correct": 1.0, "style": 0.5}
    batch.rollouts[1].rewards = {"correct": 0.0, "style": 0.5}
    batch.rollouts[2].rewards = {"correct": 1.0}
    spec = BatchCreate.model_validate(
        {
            "tasks": [{"model": "m", "instruction": "x", "domain": "d", "task_id": "a"}],
            "samples_per_task": 3,
        }
    )
    ref = close(spec, batch, 5.0)[0]
    rollouts = members(batch, ref)
    body = record(ref, rollouts, [{"job_id": r.job_id} for r in rollouts])
    assert body["rewards_mean"] == {"correct": pytest.approx(2 / 3), "style": 0.5}
    named = [s["group_rewards_normalized"] for s in body["samples"]]
    std = (2 / 9) ** 0.5
    assert named[0] == {"correct": pytest.approx((1 / 3) / std, rel=1e-5), "style": 0.0}
    assert named[1] == {"correct": pytest.approx((-2 / 3) / std, rel=1e-5), "style": 0.0}
    assert named[2] == {"correct": pytest.approx((1 / 3) / std, rel=1e-5)}
    # The summed reward is normalized as before, beside them.
    assert body["samples"][0]["group_reward_normalized"] == pytest.approx(
        0.5 / (1 / 6) ** 0.5, rel=1e-5
    )


def test_a_group_without_named_rewards_says_none() -> None:
    batch = Batch(id="batch_x", owner="o", created_at=0, samples_per_task=1, rounds=1)
    batch.rollouts = [_r("a", 0, 1, "completed", 1.0)]
    spec = BatchCreate.model_validate(
        {
            "tasks": [{"model": "m", "instruction": "x", "domain": "d", "task_id": "a"}],
            "samples_per_task": 1,
        }
    )
    ref = close(spec, batch, 5.0)[0]
    body = record(ref, members(batch, ref), [{"job_id": "a-0"}])
    assert body["rewards_mean"] is None and body["samples"][0]["group_rewards_normalized"] is None
