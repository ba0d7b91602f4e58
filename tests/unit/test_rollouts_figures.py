"""The rollouts benchmark's figures (tiergate/bench/rollouts/figures.py) on hand-made
timelines, against values computed by hand."""

from __future__ import annotations

import pytest

from tiergate.bench.rollouts.figures import GroupSpan, completions, eligible, figures, utilization


def _s(task: str, round_: int, started: float, ended: float | None) -> GroupSpan:
    return GroupSpan(task, round_, started, started, ended)


def test_a_group_completes_with_its_last_rollout_and_only_then() -> None:
    spans = [
        _s("a", 1, 0, 2),
        _s("a", 1, 0, 3),  # a's round 1: complete at 3
        _s("a", 2, 3, 5),
        _s("a", 2, 3, None),  # a's round 2: not complete
        _s("b", 1, 0, 10),
    ]
    assert completions(spans) == [3, 10]
    assert eligible(spans) == [0, 0, 3, 3, 0]


def test_utilization_counts_idle_slots_only_while_a_sample_could_have_started() -> None:
    # Two slots. Task a: round 1 on both slots 0-2; its round 2 could start at 2 but
    # starts at 4 (a barrier waiting on nothing else): slots idle 2-4 count against it.
    barrier = [_s("a", 1, 0, 2), _s("a", 1, 0, 2), _s("a", 2, 4, 6), _s("a", 2, 4, 6)]
    assert utilization(barrier, slots=2) == pytest.approx(8 / 12)
    # The same work with round 2 at once: every usable slot-second held.
    at_once = [_s("a", 1, 0, 2), _s("a", 1, 0, 2), _s("a", 2, 2, 4), _s("a", 2, 2, 4)]
    assert utilization(at_once, slots=2) == pytest.approx(1.0)
    # One slow rollout alone with nothing eligible: idle slots are not a loss.
    assert utilization([_s("slow", 1, 0, 10)], slots=4) == pytest.approx(1.0)


def test_rates_to_the_last_group_and_to_ninety_percent() -> None:
    spans = [_s(f"q{i}", 1, 0, 1 + i) for i in range(9)] + [_s("slow", 1, 0, 60)]
    f = figures(spans, slots=10, first_n=5)
    assert f["groups"] == 10 and f["makespan_s"] == 60
    assert f["groups_per_minute"] == 10.0  # 10 groups in 60 s
    assert f["time_to_90pct_groups_s"] == 9 and f["groups_per_minute_to_90pct"] == 60.0
    assert f["first_group_s"] == 1 and f["first_5_groups_s"] == 5
