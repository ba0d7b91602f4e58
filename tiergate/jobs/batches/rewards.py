"""Rewards normalized where they are compared (docs/batches.md has the
formulas).

A rollout's raw reward ``r`` is its verifier's reward, or 1.0 / 0.0 for passed / not
passed when the verifier wrote none. Rollouts that did not run to a verdict (failed,
cancelled) take no part.

- Per task group ``g`` (the samples of one task): ``mean_g``, ``std_g`` (population), and
  each rollout's advantage ``a = r - mean_g``; ``reward_normalized = a / (std_g + eps)``
  (the group z-score; 0 when every sample scored the same).
- Per domain ``d``: the scale ``s_d = sqrt(mean of a^2 over d's rollouts)``, and each
  rollout's ``normalized_advantage = clip(a / s_d, -c, c)`` (``c``: the batch's
  ``advantage_clip``; 0 when ``s_d`` is 0), so that a domain scoring 0-100 and one scoring
  0-1 weigh alike, and no outlier dominates.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from tiergate.protocol.batches import Rollout

EPS = 1e-6
SCORED = ("completed", "incomplete")


@dataclass(frozen=True)
class GroupStats:
    n: int
    passed: int
    mean: float
    std: float


def scored(rollouts: Iterable[Rollout]) -> list[Rollout]:
    return [r for r in rollouts if r.status in SCORED and r.reward is not None]


def group_stats(rewards: list[float], passed: int) -> GroupStats:
    n = len(rewards)
    if n == 0:
        return GroupStats(0, 0, 0.0, 0.0)
    mean = sum(rewards) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in rewards) / n)
    return GroupStats(n, passed, mean, std)


def normalize(rollouts: list[Rollout], clip: float) -> dict[str, tuple[float, float, float]]:
    """``{job id: (advantage, reward_normalized, normalized_advantage)}`` of every scored
    rollout (the formulas in the module's text)."""
    groups: dict[tuple[str, str], list[Rollout]] = defaultdict(list)
    for rollout in scored(rollouts):
        groups[(rollout.domain, rollout.task_id)].append(rollout)
    raw: dict[str, tuple[float, float]] = {}
    domain_sq: dict[str, list[float]] = defaultdict(list)
    for (domain, _), members in groups.items():
        rewards = [float(m.reward or 0.0) for m in members]
        stats = group_stats(rewards, sum(1 for m in members if m.passed))
        for member, reward in zip(members, rewards, strict=True):
            advantage = reward - stats.mean
            z = advantage / (stats.std + EPS) if stats.std > 0 else 0.0
            raw[member.job_id] = (advantage, z)
            domain_sq[domain].append(advantage * advantage)
    scale = {d: math.sqrt(sum(sq) / len(sq)) for d, sq in domain_sq.items()}
    out: dict[str, tuple[float, float, float]] = {}
    for rollout in scored(rollouts):
        advantage, z = raw[rollout.job_id]
        s = scale[rollout.domain]
        normalized = max(-clip, min(clip, advantage / s)) if s > EPS else 0.0
        out[rollout.job_id] = (advantage, z, normalized)
    return out
