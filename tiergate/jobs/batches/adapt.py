"""Sampling that follows the signal (a batch's ``adaptive``): domain weights that move
toward the domains whose pass rate is inside a target band, and extra samples that go
first to the tasks whose rewards vary most. Pure functions over the batch's request and
state, called by the scheduler (:mod:`.schedule`); every change they make is recorded in
the batch with its reason.

Why these rules. Under group-relative rewards a task whose samples all pass or all fail
teaches nothing (it is skipped as saturated), and a domain that is nearly solved or
nearly hopeless yields few mixed groups per sample spent: so a domain's share of the
slots grows while its recent pass rate is inside the band and shrinks outside it,
multiplicatively and within bounds, so that a domain that leaves the band can come back
and no domain is ever starved (the scheduler gives any domain with samples left at least
one slot). Within a domain the next samples go where the reward's variance is largest:
the expected magnitude of a group-normalized advantage grows with it.
"""

from __future__ import annotations

import statistics

from tiergate.protocol.batches import Batch, BatchCreate, Rollout, WeightChange

SCORED = ("completed", "incomplete")


def reward(rollout: Rollout) -> float:
    """A scored rollout's reward: its verifier's, else 1 / 0 for passed / not."""
    if rollout.reward is not None:
        return rollout.reward
    return 1.0 if rollout.passed else 0.0


def variance(rollouts: list[Rollout]) -> float:
    """The population variance of the scored rollouts' rewards (0 below two)."""
    rewards = [reward(r) for r in rollouts if r.status in SCORED]
    return statistics.pvariance(rewards) if len(rewards) > 1 else 0.0


def weight(spec: BatchCreate, batch: Batch, domain: str) -> float:
    """The domain's weight now: the request's, times its adaptive factor."""
    return spec.domain_weights.get(domain, 1.0) * batch.weight_factors.get(domain, 1.0)


def reweigh(spec: BatchCreate, batch: Batch) -> None:
    """Move each domain's factor once ``adaptive.every`` more of its rollouts were scored."""
    rules = spec.adaptive
    if rules is None:
        return
    scored: dict[str, list[Rollout]] = {}
    for rollout in batch.rollouts:
        if rollout.status in SCORED and rollout.domain not in batch.removed_domains:
            scored.setdefault(rollout.domain, []).append(rollout)
    low, high = rules.target_pass_rate
    for domain, mine in sorted(scored.items()):
        if len(mine) - batch.weighed_at.get(domain, 0) < rules.every:
            continue
        batch.weighed_at[domain] = len(mine)
        latest = mine[-rules.every :]
        rate = sum(1 for r in latest if r.passed) / len(latest)
        previous = batch.weight_factors.get(domain, 1.0)
        if low <= rate <= high:
            factor = min(rules.max_factor, previous * rules.step)
            reason = f"pass rate {rate:.0%} inside the target [{low:.0%}, {high:.0%}]"
        else:
            factor = max(rules.min_factor, previous / rules.step)
            side = "solved" if rate > high else "hopeless"
            reason = f"pass rate {rate:.0%} outside the target [{low:.0%}, {high:.0%}] ({side})"
        if factor == previous:
            continue  # at its bound already
        batch.weight_factors[domain] = factor
        batch.weight_changes.append(
            WeightChange(
                domain=domain,
                previous=previous,
                factor=factor,
                pass_rate=rate,
                scored=len(mine),
                reason=f"{reason}, over its latest {len(latest)} scored rollouts",
            )
        )
