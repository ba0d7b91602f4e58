"""What an answer's timing hands the patient lane (tiergate.gateway.openai.timing): a
stream the client read slowly, and a non-streamed answer that came in one read, are not
its signal; the others are, with their TTFT and TPOT. Stand-ins record the calls."""

from __future__ import annotations

from typing import Any

import pytest

from tiergate.gateway.openai.streaming import StreamOutcome
from tiergate.gateway.openai.timing import answer_times, choices_of
from tiergate.tiers import Tier

USAGE = {"completion_tokens": 11}


class _Metrics:  # fake: records what would go into the histograms
    ttft, tpot = "ttft", "tpot"

    def __init__(self) -> None:
        self.seen: list[tuple[str, float]] = []

    def observe(self, metric: str, value: float, *labels: Any) -> None:
        self.seen.append((metric, value))


class _Lease:  # fake: records what the lane would be told
    def __init__(self) -> None:
        self.told: list[tuple[float, float]] = []

    def observe_answer(self, tier: Tier, tpot: float, ttft: float) -> None:
        self.told.append((tpot, ttft))


def _time(
    timed: tuple[float, float, float], stream: StreamOutcome | None
) -> tuple[_Metrics, _Lease, dict[str, Any]]:
    metrics, lease, fields = _Metrics(), _Lease(), {}
    answer_times(metrics, fields, lease, Tier.STANDARD, timed, USAGE, stream)  # type: ignore[arg-type]
    return metrics, lease, fields


def test_a_stream_read_at_once_is_the_lanes_signal_and_the_histograms() -> None:
    metrics, lease, fields = _time((0.0, 0.5, 1.5), StreamOutcome(completed=True))
    assert lease.told == [(0.1, 0.5)]
    assert metrics.seen == [("ttft", 0.5), ("tpot", 0.1)]
    assert fields == {"ttft_ms": 500.0, "tpot_ms": 100.0}


def test_a_stream_the_client_read_slowly_is_logged_not_signalled() -> None:
    slow = StreamOutcome(completed=True, client_wait_seconds=0.2)  # over 5% of 1.5 s
    metrics, lease, fields = _time((0.0, 0.5, 1.5), slow)
    assert lease.told == [] and fields["client_wait_ms"] == 200.0
    assert ("tpot", 0.1) in metrics.seen  # what the client saw is still counted
    _, lease, _ = _time((0.0, 0.5, 1.5), StreamOutcome(completed=True, client_wait_seconds=0.05))
    assert lease.told == [(0.1, 0.5)]


def test_a_non_streamed_answer_is_signalled_unless_one_read_held_it_all() -> None:
    metrics, lease, fields = _time((0.0, 0.5, 1.5), None)
    assert lease.told == [(0.1, 0.5)] and metrics.seen == []  # histograms: streams only
    assert fields == {"ttft_ms": 500.0, "tpot_ms": 100.0}
    _, lease, fields = _time((0.0, 1.5, 1.5), None)
    assert lease.told == [] and "tpot_ms" not in fields


def test_a_stream_of_n_choices_is_timed_per_choice() -> None:
    """Attacker's test: vLLM's completion_tokens sums the n choices decoded side by side, so
    an ``n=8`` stream timed on it looked 8x faster than the engine was, and a few such
    streams held the lane open while every other tenant was slowed."""
    metrics, lease, fields = _Metrics(), _Lease(), {}
    usage = {"completion_tokens": 8 * 16}  # n=8, max_tokens=16: 16 steps of 8 tokens
    timed = (0.0, 0.1, 0.1 + 15 * 0.060)  # the engine took 60 ms a step
    answer_times(metrics, fields, lease, Tier.STANDARD, timed, usage, None, 8)  # type: ignore[arg-type]
    assert lease.told == [(pytest.approx(0.060), 0.1)]
    assert fields["tpot_ms"] == pytest.approx(60.0)


def test_choices_are_read_from_n_and_anything_odd_counts_as_one() -> None:
    assert choices_of({"n": 8}) == 8
    assert choices_of({"n": 8.0}) == 8
    for odd in ({}, {"n": None}, {"n": 0}, {"n": -3}, {"n": "8"}, {"n": True}, {"n": 2.5}):
        assert choices_of(odd) == 1, odd
