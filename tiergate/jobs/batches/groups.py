"""Groups a trainer can take while the batch runs (issue 51): one task's samples of one
round, complete once every sample of that round has ended.

The scheduler's pass closes the groups that completed since the last one
(:func:`close`, recorded in the batch's state as :class:`GroupRef`, numbered in the
order they completed), and the gateway serves each group once, as JSON lines after a
``starting_after`` and as Server-Sent Events (tiergate.gateway.jobs.batches). A group's
record carries its samples with their rewards normalized **within the group** (the
samples of that round: ``advantage = r - mean``, ``reward_normalized = advantage /
(std + 1e-6)``, 0 when they all scored alike), what a group-relative trainer uses, and
each named reward likewise where the verifier wrote several; the
batch's own rollout figures are normalized over all of a task's samples so far and per
domain (tiergate.jobs.batches.rewards).

A round's group is complete when as many of its samples have ended as the round plans
(``samples_per_task`` in round 1, ``extra_samples`` after), or, once nothing more of the
batch will start (it ended: completed, cancelled, its budget spent, or the domain taken
out), with what ran.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from tiergate.jobs.batches.rewards import EPS, GroupStats, group_stats
from tiergate.protocol.batches import Batch, BatchCreate, GroupRef, Rollout

TERMINAL = ("completed", "incomplete", "failed", "cancelled")
SCORED = ("completed", "incomplete")


def close(spec: BatchCreate, batch: Batch, now: float) -> list[GroupRef]:
    """Record the groups complete now and not recorded yet; returns them."""
    seen = {(g.domain, g.task_id, g.round) for g in batch.groups}
    rounds: dict[tuple[str, str, int], list[Rollout]] = defaultdict(list)
    for rollout in batch.rollouts:
        rounds[(rollout.domain, rollout.task_id, rollout.round)].append(rollout)
    final = batch.status != "in_progress"
    closed = []
    for key, members in rounds.items():
        if key in seen or not all(r.status in TERMINAL for r in members):
            continue
        scored = sum(1 for r in members if r.status in SCORED)
        whole = len(members) >= spec.round_size(key[2]) or scored >= spec.group_size(key[2])
        if whole or final or key[0] in batch.removed_domains:
            ref = GroupRef(
                seq=len(batch.groups) + 1,
                domain=key[0],
                task_id=key[1],
                round=key[2],
                completed_at=now,
            )
            batch.groups.append(ref)
            closed.append(ref)
    return closed


def members(batch: Batch, ref: GroupRef) -> list[Rollout]:
    return [
        r
        for r in batch.rollouts
        if r.domain == ref.domain and r.task_id == ref.task_id and r.round == ref.round
    ]


def record(ref: GroupRef, rollouts: list[Rollout], samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The group as a trainer reads it: its figures, and each sample (``samples``: the
    rollouts' export records, tiergate.jobs.batches.export, in ``rollouts``' order) with
    its reward normalized within the group."""
    scored = [r for r in rollouts if r.status in SCORED]
    rewards = [float(r.reward) if r.reward is not None else float(bool(r.passed)) for r in scored]
    stats = group_stats(rewards, sum(1 for r in scored if r.passed))
    by_job = dict(zip((r.job_id for r in scored), rewards, strict=True))
    named = _named(scored)
    out = []
    for rollout, sample in zip(rollouts, samples, strict=True):
        reward = by_job.get(rollout.job_id)
        advantage = None if reward is None else reward - stats.mean
        out.append(
            {
                **sample,
                "status": rollout.status,
                "group_advantage": advantage,
                "group_reward_normalized": _z(advantage, stats.std),
                "group_rewards_normalized": {
                    name: _z(value - named[name].mean, named[name].std)
                    for name, value in (rollout.rewards or {}).items()
                    if name in named and rollout.status in SCORED
                }
                or None,
            }
        )
    return {
        "object": "jobs.batch.group",
        "seq": ref.seq,
        "domain": ref.domain,
        "task_id": ref.task_id,
        "round": ref.round,
        "completed_at": ref.completed_at,
        "scored": stats.n,
        "passed": stats.passed,
        "reward_mean": stats.mean if stats.n else None,
        "reward_std": stats.std if stats.n else None,
        "rewards_mean": {name: g.mean for name, g in named.items()} or None,
        "rewards_std": {name: g.std for name, g in named.items()} or None,
        "samples": out,
    }


def _z(advantage: float | None, std: float) -> float | None:
    if advantage is None:
        return None
    return advantage / (std + EPS) if std > 0 else 0.0


def _named(scored: list[Rollout]) -> dict[str, GroupStats]:
    """Each named reward's figures over the scored samples that have it (a verifier that
    writes several rewards, tiergate.jobs.run.jobsandbox.read_rewards): a trainer with
    several reward functions normalizes each within the group before it weighs them."""
    values: dict[str, list[float]] = defaultdict(list)
    for rollout in scored:
        for name, value in (rollout.rewards or {}).items():
            values[name].append(value)
    return {name: group_stats(found, 0) for name, found in sorted(values.items())}
