"""Rollout batches whose verifiers score several things at once (issue 51 item 4: "per
reward where a task has several"): the verifier writes its rewards by name, each sample's
rollout keeps them, and each group a trainer takes carries every named reward normalized
within the group beside the summed one. Real broker, object store and sandbox; the model is
the fake."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes.fake_vllm import FakeVllm
from tests.jobs.test_batches import MIXED, _stack, task
from tiergate.jobsclient import JobsClient

# "correct" is the coin MIXED flipped (1 or 0); "format" is always 0.5.
VERIFIER = {
    "command": 'c=0; test -f ok && c=1; echo "{\\"correct\\": $c, \\"format\\": 0.5}" > r.json',
    "reward_file": "r.json",
}


def test_named_rewards_reach_the_rollouts_and_each_is_normalized_within_its_group(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    tasks = [task("d", f"t{i}", MIXED, verifier=VERIFIER) for i in range(2)]
    with _stack(broker, s3, model, tmp_path) as stack:
        stack.start_worker()
        with JobsClient(stack.base) as client:
            batch = client.submit_batch(tasks, samples_per_task=3, rounds=1, max_in_flight=4)
            groups = list(client.groups(batch.id, poll_seconds=0.5, timeout=240))
            final = client.wait_batch(batch.id, timeout=60, poll_seconds=0.5)
            exported = client.rollouts(batch.id)
    assert {tuple(sorted(r["rewards"])) for r in exported} == {("correct", "format")}
    assert final.status == "completed" and len(groups) == 2
    for rollout in final.rollouts:
        assert rollout.rewards is not None and rollout.reward is not None
        assert rollout.rewards["format"] == 0.5
        assert rollout.reward == pytest.approx(rollout.rewards["correct"] + 0.5)
    for group in groups:
        assert group["rewards_mean"]["format"] == 0.5 and group["rewards_std"]["format"] == 0
        assert group["rewards_mean"]["correct"] == pytest.approx(group["reward_mean"] - 0.5)
        for sample in group["samples"]:
            named = sample["group_rewards_normalized"]
            assert named["format"] == 0.0  # every sample scored it alike
            # The coin is the only thing that varies: its z-score is the summed one's.
            assert named["correct"] == pytest.approx(sample["group_reward_normalized"], abs=1e-6)
