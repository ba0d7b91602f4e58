"""A verifier's reward file (tiergate.jobs.run.jobsandbox.read_rewards): a number, or a
JSON object of named rewards whose sum is the reward. The verifier is the task's author's
code run in the sandbox: whatever it writes is bounded, and anything else is no reward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tiergate.jobs.run.jobsandbox import MAX_NAMED_REWARDS, read_reward, read_rewards


def _write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "reward.txt").write_text(text)
    return tmp_path


def test_a_number_is_the_reward_without_names(tmp_path: Path) -> None:
    assert read_rewards(_write(tmp_path, "0.75\nall tests passed\n"), "reward.txt") == (0.75, None)
    assert read_reward(tmp_path, "reward.txt") == 0.75


def test_named_rewards_are_kept_and_summed(tmp_path: Path) -> None:
    _write(tmp_path, json.dumps({"correct": 1, "format": 0.5, "len-penalty_2.x": -0.25}))
    reward, named = read_rewards(tmp_path, "reward.txt")
    assert reward == pytest.approx(1.25)
    assert named == {"correct": 1.0, "format": 0.5, "len-penalty_2.x": -0.25}


@pytest.mark.parametrize(
    "text",
    [
        "nan",
        "inf",
        "-Infinity",
        '{"a": NaN}',
        '{"a": Infinity}',
        '{"a": true}',
        '{"a": "1"}',
        '{"a": [1]}',
        "{}",
        '{"a b": 1}',
        json.dumps({"x" * 65: 1}),
        json.dumps({f"r{i}": 1 for i in range(MAX_NAMED_REWARDS + 1)}),
        "[1, 2]",
        '{"a": 1',
        "",
        '{"a": ' + "[" * 20000 + "]" * 20000 + "}",  # nested past the parser's depth
        json.dumps({f"r{i}": 1.7e308 for i in range(4)}),  # each finite, their sum not
        '{"a": ' + "9" * 5000 + "}",  # an integer past Python's digit limit
    ],
)
def test_anything_else_is_no_reward(tmp_path: Path, text: str) -> None:
    assert read_rewards(_write(tmp_path, text), "reward.txt") == (None, None)


def test_the_most_names_is_accepted(tmp_path: Path) -> None:
    _write(tmp_path, json.dumps({f"r{i}": 1 for i in range(MAX_NAMED_REWARDS)}))
    reward, named = read_rewards(tmp_path, "reward.txt")
    assert reward == MAX_NAMED_REWARDS and named is not None and len(named) == MAX_NAMED_REWARDS
