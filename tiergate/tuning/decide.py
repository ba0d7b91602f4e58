"""The choice of the fast tier from measured candidates: one pure function.

The fastest recipe that passed parity wins if it is at least ``min_speedup`` faster than
the standard tier at the first (lowest) concurrency level and not slower than
``min_any_level`` at any level. "Fastest" allows for the measurement's noise: recipes
within :data:`TIE_BAND` of the fastest are a tie, which goes to the simpler recipe
(lossless first, then one without speculation). On a 2-core Xeon the same configuration's
median TPOT at concurrency 1 measured 25.5 ms in one tuning and 32.5 ms in the next (six
requests a level), so two recipes 10% apart can swap places from run to run; the tie rule
makes the decision the same each time. "Not slower" allows for the same noise, less widely:
a level counts as slower only below ``min_any_level`` by more than :data:`SLOWER_BAND`. On
an AMD EPYC Zen 4 the same recipe (INT8 with ngram at batch 1) measured 0.98x at
concurrency 4 as served in one tuning and 1.23x in the next, and the first tuning set it
aside as slower: with the band both choose it. Otherwise the fast tier runs the best
lossless recipe that passed parity and is nowhere slower, or, when there is none, the
standard configuration itself: never a fast tier that is measurably slower or unproven.
"""

from __future__ import annotations

from dataclasses import dataclass

from tiergate.enginesettings import Recipe
from tiergate.evidence import CandidateResult, ParitySummary, TierVerdict

# Speedups within this fraction of the fastest are one speed (see the module's text).
TIE_BAND = 0.10
# A level is slower than the standard tier only below min_any_level by more than this.
SLOWER_BAND = 0.05
# Why a candidate fast enough on its own was not judged: a proven recipe was ahead of it.
BEHIND_A_PROVEN_RECIPE = "not faster than a recipe already proven"


@dataclass(frozen=True)
class Choice:
    recipe: Recipe | None
    verdict: TierVerdict
    reason: str
    speedup: dict[str, float]


def _nowhere_slower(result: CandidateResult, min_any_level: float) -> bool:
    return bool(result.speedup) and min(result.speedup.values()) >= min_any_level * (
        1 - SLOWER_BAND
    )


def _primary(result: CandidateResult, level: str) -> float:
    return result.speedup.get(level, 0.0)


def choose(
    results: list[CandidateResult],
    min_speedup: float,
    min_any_level: float,
    primary_level: str = "1",
) -> Choice:
    proven = [
        r
        for r in results
        if r.parity is not None and r.parity.passed and _nowhere_slower(r, min_any_level)
    ]
    # Ties (within the noise band) go to the simpler recipe: the same speed for less risk.
    best = max((_primary(r, primary_level) for r in proven), default=0.0)

    def order(r: CandidateResult) -> tuple[bool, bool, bool, float]:
        tied = _primary(r, primary_level) * (1 + TIE_BAND) >= best
        return (tied, r.recipe.lossless, r.recipe.speculative is None, _primary(r, primary_level))

    rank = sorted(proven, key=order, reverse=True)
    for result in rank:
        if _primary(result, primary_level) >= min_speedup:
            return Choice(
                result.recipe,
                "faster",
                f"{result.recipe.name} is the fastest recipe that passed parity: "
                f"{_primary(result, primary_level):.2f}x at concurrency {primary_level}",
                dict(result.speedup),
            )
    for result in rank:
        if result.recipe.lossless:
            return Choice(
                result.recipe,
                "equal",
                f"no recipe was {min_speedup:.2f}x faster with parity on this hardware; "
                f"running the best lossless one ({result.recipe.name}, "
                f"{_primary(result, primary_level):.2f}x)",
                dict(result.speedup),
            )
    return Choice(
        None,
        "equal",
        f"no recipe was {min_speedup:.2f}x faster with parity on this hardware, and no "
        "lossless one was at least as fast; the fast tier runs the standard configuration",
        {level: 1.0 for r in results for level in r.speedup} or {primary_level: 1.0},
    )


def worth_judging(
    candidate: CandidateResult,
    others: list[CandidateResult],
    min_speedup: float,
    min_any_level: float,
    primary_level: str = "1",
) -> bool:
    """Whether a parity judgement could change the choice: would ``candidate`` be chosen
    over ``others`` if it passed? Judging only such candidates bounds the tuning time."""
    if not _nowhere_slower(candidate, min_any_level):
        return False
    if candidate.parity is not None and not candidate.parity.passed:
        return False
    hypothetical = candidate.model_copy(update={"parity": _ASSUMED_PASS})
    choice = choose([*others, hypothetical], min_speedup, min_any_level, primary_level)
    return choice.recipe is not None and choice.recipe == candidate.recipe


_ASSUMED_PASS = ParitySummary(
    passed=True,
    next_token_agreement=1.0,
    agreement_low=1.0,
    kl_mean=0.0,
    kl_high=0.0,
    task_difference=0.0,
    task_difference_low=0.0,
    tasks=0,
    positions=0,
    seconds=0.0,
)


def judge_next(
    results: list[CandidateResult],
    min_speedup: float,
    min_any_level: float,
    primary_level: str = "1",
) -> int | None:
    """The candidate to judge now, if any: one left unjudged only because a proven recipe
    was ahead of it (:data:`BEHIND_A_PROVEN_RECIPE`) that would be chosen now if it passed,
    the fastest such at ``primary_level``. The recipe ahead of it may since have been
    measured as served and fallen short (on an AMD EPYC Zen 4 INT8 with ngram at batch 1
    went from 1.39x / 1.07x screened to 1.34x / 0.98x served, and the fast tier ran the
    standard configuration while bf16 + ngram at 1.18x / 1.17x screened was never judged)."""
    waiting = [
        i
        for i, r in enumerate(results)
        if r.note == BEHIND_A_PROVEN_RECIPE
        and r.parity is None
        and worth_judging(
            r, results[:i] + results[i + 1 :], min_speedup, min_any_level, primary_level
        )
    ]
    return max(waiting, key=lambda i: _primary(results[i], primary_level), default=None)
