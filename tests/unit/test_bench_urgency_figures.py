"""The urgency benchmark's figures from constructed samples: the ordering counts and the
targets."""

from __future__ import annotations

from typing import Any

import pytest

from tiergate.bench.urgency.figures import aggregate_tokens_per_s, backlog_figures, summarize
from tiergate.measure.stream import Sample


def _sample(sent: float, first: float | None, tokens: int = 10) -> Sample:
    ttft = 0.0 if first is None else first - sent
    return Sample(ttft, (first or sent) + 1.0 - sent, tokens, sent, first)


def test_queued_requests_are_those_without_a_first_token_when_priority_was_sent() -> None:
    standard = [
        _sample(0.0, 0.1),  # streaming before the priority request: not queued
        _sample(0.0, 0.2),
        _sample(0.0, 0.9),  # queued, and first before the priority request
        _sample(0.0, 1.5),  # queued, after it
        _sample(0.0, 3.0),  # after the flex request too
        _sample(0.0, None),  # never answered: counted apart
    ]
    priority = _sample(0.5, 1.0)
    flex = _sample(0.5, 2.0)
    figures = backlog_figures(standard, priority, flex, idle_priority_ttft=0.25)
    assert figures["queued_when_priority_sent"] == 3
    assert figures["queued_standard_first_before_priority"] == 1
    assert figures["standard_first_after_flex"] == 1
    assert figures["standard_without_first_token"] == 1
    assert figures["priority_ttft_ms"] == pytest.approx(500)
    assert figures["priority_ttft_vs_idle"] == pytest.approx(2.0)
    assert figures["flex_ttft_ms"] == pytest.approx(1500)
    assert figures["flex_first_after_last_standard_ms"] == pytest.approx(-1000)


def test_a_priority_request_without_a_first_token_counts_every_queued_one_first() -> None:
    standard = [_sample(0.0, 0.1), _sample(0.0, 0.9), _sample(0.0, 1.2)]
    figures = backlog_figures(standard, _sample(0.5, None), _sample(0.5, 2.0), 0.1)
    assert figures["queued_standard_first_before_priority"] == 2
    assert figures["priority_answered"] is False


def _round(single: float, shared: float, idle: float, backlog: float, **b: Any) -> dict[str, Any]:
    counts = {"queued_standard_first_before_priority": 0, "standard_first_after_flex": 0}
    return {
        "single_tokens_per_s": single,
        "shared_tokens_per_s": shared,
        "idle_priority_ttft_ms": idle,
        "idle_flex_ttft_ms": idle,
        "backlog": {
            "priority_ttft_ms": backlog,
            "flex_ttft_ms": 5 * backlog,
            "priority_answered": True,
            "flex_answered": True,
            "as_planned": True,
            **counts,
            **b,
        },
    }


def test_medians_over_rounds_and_the_targets() -> None:
    rounds = [
        _round(100, 170, 200, 260),
        _round(90, 150, 220, 290),
        _round(110, 120, 180, 900),  # a disturbed round: the medians ignore it
    ]
    s = summarize(rounds)
    assert s["single_tokens_per_s"] == 100 and s["shared_tokens_per_s"] == 150
    assert s["shared_vs_single"] == pytest.approx(1.5)
    assert s["backlog_priority_ttft_vs_idle"] == pytest.approx(290 / 200)
    assert all(t["met"] for t in s["targets"].values())

    rounds[1]["backlog"]["standard_first_after_flex"] = 2
    rounds[2]["backlog"]["queued_standard_first_before_priority"] = 1
    s = summarize(rounds)
    assert s["targets"]["shared_engines"]["met"] is True
    assert s["targets"]["priority_first"]["met"] is False  # one round is enough
    assert s["targets"]["flex_last"] == {
        "target": s["targets"]["flex_last"]["target"],
        "value": 2,
        "met": False,
    }


def test_slow_shared_engines_miss_the_first_target() -> None:
    s = summarize([_round(100, 140, 200, 200)])
    assert s["targets"]["shared_engines"]["met"] is False
    assert s["targets"]["priority_first"]["met"] is True


def test_aggregate_speed_is_all_output_tokens_over_the_wall_time() -> None:
    assert aggregate_tokens_per_s([_sample(0, 0.1, 30), _sample(0, 0.2, 50)], 2.0) == 40
