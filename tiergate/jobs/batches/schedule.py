"""What a batch runs next: a pure decision over the batch's request and its rollouts so far
(the driver, :mod:`.driver`, reads and writes the store around it).

- **Rounds, each task's own.** Round 1 plans ``samples_per_task`` samples of every task.
  When every sample a task has started has ended, that task is judged at once: if its
  scored samples so far all passed or all failed it is *saturated* and gets no more
  samples (under group-relative rewards it carries no learning signal), a skip says so;
  otherwise it gets ``extra_samples`` more in its next round, up to ``rounds``. So a slow
  task holds only its own slots: the quick tasks' next samples start while it runs (with
  a batch-wide barrier, one task ten times slower than the rest kept the slots idle for
  most of every round). The batch's ``schedule: rounds`` keeps that barrier, judging every
  task once every rollout of the batch has ended, to compare against (``tiergate bench``).
- **Domains share the running jobs by weight.** At most ``max_in_flight`` of the batch's
  jobs wait or run at once; a domain with samples left may hold at most its weight's share
  of them (``ceil(max_in_flight * w / sum of the active domains' w)``), and the
  next sample goes to the domain with the fewest in flight for its weight. A domain of
  slow tasks therefore holds its share of the slots, never the others'. (The share is of
  the batch's jobs in flight: it is the share of the slots while ``max_in_flight`` is at
  most the slots the batch gets; more wait in the queue in the order they were sent.)
- **A domain whose environment keeps failing is taken out**: three or more of its rollouts
  ended with an infrastructure failure (``environment_unavailable``, ``sandbox``,
  ``environment_not_found``) and more of them than scored ones. Its samples left are
  skipped and its queued jobs cancelled; the other domains go on.
- **Budget**: no sample starts once ``budget.max_jobs`` jobs were sent or the finished
  rollouts spent ``budget.max_tokens``.
- **Cancel**: nothing more starts; jobs still queued are cancelled, running ones end.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from tiergate.jobs.batches.adapt import reweigh, variance, weight
from tiergate.protocol.batches import Allocation, Batch, BatchCreate, Rollout, Skip

INFRA_FAILURES = ("environment_unavailable", "sandbox", "environment_not_found")
TERMINAL = ("completed", "incomplete", "failed", "cancelled")


@dataclass(frozen=True)
class Sample:
    task: int  # index into the batch's tasks
    sample: int
    round: int


@dataclass
class RoundPlan:
    start: list[Sample] = field(default_factory=list)
    cancel: list[str] = field(default_factory=list)  # job ids still queued to cancel


def terminal(rollout: Rollout) -> bool:
    return rollout.status in TERMINAL


def decide(spec: BatchCreate, batch: Batch, cancelled: bool, now: float | None = None) -> RoundPlan:
    """Change ``batch`` (round, skips, removed domains, status) and say what to start and
    what to cancel now (``now``: the time, for ``tail_cut``)."""
    plan = RoundPlan()
    _remove_failing_domains(batch)
    if spec.tail_cut is not None and now is not None and batch.status == "in_progress":
        plan.cancel += _cut_tail(spec.tail_cut, batch, now)
    if spec.max_staleness is not None and batch.status == "in_progress":
        plan.cancel += _withdraw_stale(spec, batch)
    if spec.overprovision and batch.status == "in_progress":
        plan.cancel += _cancel_surplus(spec, batch)
    if cancelled and batch.status == "in_progress":
        batch.status = "cancelled"
        batch.skips.append(Skip(domain="*", reason="cancelled", detail="the batch was cancelled"))
    if batch.status == "cancelled" or batch.removed_domains:
        plan.cancel += [
            r.job_id
            for r in batch.rollouts
            if r.status == "queued"
            and (batch.status == "cancelled" or r.domain in batch.removed_domains)
        ]
    if batch.status != "in_progress":
        return plan
    if batch.schedule == "per_task":
        _next_rounds_per_task(spec, batch)
    wanted = _wanted(spec, batch)
    if not wanted and all(terminal(r) for r in batch.rollouts):
        if batch.schedule == "rounds" and batch.round < spec.rounds and _next_round(spec, batch):
            wanted = _wanted(spec, batch)
        else:
            batch.status = "completed"
            return plan
    over = _over_budget(spec, batch)
    if over is not None:
        if not any(s.reason == "budget" for s in batch.skips) and wanted:
            batch.skips.append(Skip(domain="*", reason="budget", detail=over))
        if all(terminal(r) for r in batch.rollouts):
            batch.status = "completed"
        return plan
    reweigh(spec, batch)
    plan.start = _fill(spec, batch, wanted)
    return plan


def task_key(domain: str, task_id: str) -> str:
    return f"{domain}/{task_id}"


def _planned(spec: BatchCreate, batch: Batch) -> list[Sample]:
    """Every sample planned so far (``batch.planned`` per task; round 1's when absent)."""
    samples = []
    first, later = spec.round_size(1), spec.round_size(2)  # spec.round_of, for every sample
    for index, task in enumerate(spec.tasks):
        count = batch.planned.get(task_key(task.domain, task.task_id), first)
        samples += [
            Sample(index, i, 1 if i < first else 2 + (i - first) // later) for i in range(count)
        ]
    return samples


def _wanted(spec: BatchCreate, batch: Batch) -> list[Sample]:
    """Planned samples not started yet, of domains still in the batch and rounds not yet
    satisfied (``overprovision``'s surplus is not started once it is not needed)."""
    started = {(r.task_id, r.domain, r.sample) for r in batch.rollouts}
    scored = Counter(
        (r.task_id, r.domain, r.round)
        for r in batch.rollouts
        if r.status in ("completed", "incomplete")
    )
    wanted = []
    for s in _planned(spec, batch):
        task = spec.tasks[s.task]
        if (task.task_id, task.domain, s.sample) in started or task.domain in batch.removed_domains:
            continue
        if scored[(task.task_id, task.domain, s.round)] >= spec.group_size(s.round):
            continue
        wanted.append(s)
    return wanted


def _by_task(batch: Batch) -> dict[tuple[str, str], list[Rollout]]:
    by_task: dict[tuple[str, str], list[Rollout]] = defaultdict(list)
    for rollout in batch.rollouts:
        by_task[(rollout.domain, rollout.task_id)].append(rollout)
    return by_task


def _task_round(spec: BatchCreate, batch: Batch, key: tuple[str, str]) -> int:
    """The round ``key``'s task has reached (its planned samples' last)."""
    return spec.round_of(batch.planned.get(task_key(*key), spec.round_size(1)) - 1)


def _judge_task(spec: BatchCreate, batch: Batch, key: tuple[str, str], mine: list[Rollout]) -> bool:
    """End ``key``'s task's round: saturated (a skip says why), or its next round's samples
    planned (True)."""
    reached = _task_round(spec, batch, key)
    verdicts = [r.passed for r in mine if r.status in ("completed", "incomplete")]
    if verdicts and (all(verdicts) or not any(verdicts)):
        what = "passed" if all(verdicts) else "failed"
        batch.skips.append(
            Skip(
                domain=key[0],
                task_id=key[1],
                reason="saturated",
                detail=f"after round {reached}: all {len(verdicts)} samples {what}",
            )
        )
        return False
    planned = batch.planned.get(task_key(*key), spec.round_size(1))
    extra = spec.round_size(reached + 1)
    batch.planned[task_key(*key)] = planned + extra
    batch.round = max(batch.round, reached + 1)
    passed = sum(1 for v in verdicts if v)
    why = (
        f"{passed} of {len(verdicts)} scored samples passed (reward variance {variance(mine):.3f})"
        if verdicts
        else "no sample scored yet"
    )
    batch.allocations.append(
        Allocation(domain=key[0], task_id=key[1], round=reached + 1, samples=extra, reason=why)
    )
    return True


def _open_tasks(spec: BatchCreate, batch: Batch) -> list[tuple[str, str]]:
    """The tasks that may still get samples: not saturated, their domain not removed."""
    already = {(s.domain, s.task_id) for s in batch.skips if s.reason == "saturated"}
    keys = [(t.domain, t.task_id) for t in spec.tasks]
    return [k for k in keys if k not in already and k[0] not in batch.removed_domains]


def _next_round(spec: BatchCreate, batch: Batch) -> bool:
    """The barrier (``schedule: rounds``): every rollout has ended; judge every task. True
    if any task gets more samples."""
    by_task = _by_task(batch)
    more = False
    for key in _open_tasks(spec, batch):
        more = _judge_task(spec, batch, key, by_task[key]) or more
    return more


def _next_rounds_per_task(spec: BatchCreate, batch: Batch) -> None:
    """Each task on its own (``schedule: per_task``): a task whose planned samples have all
    started and ended, below its last round, is judged now."""
    by_task = _by_task(batch)
    for key in _open_tasks(spec, batch):
        mine = by_task[key]
        reached = _task_round(spec, batch, key)
        current = [r for r in mine if r.round == reached]
        if not all(terminal(r) for r in mine):
            continue  # samples running: its round goes on
        if len(current) < spec.round_size(reached) and not _satisfied(spec, reached, current):
            continue  # samples still to start
        if reached < spec.rounds:
            _judge_task(spec, batch, key, mine)


def _satisfied(spec: BatchCreate, round_: int, members: list[Rollout]) -> bool:
    """Whether a task's round has as many scored samples as its group needs (with
    ``overprovision``, its other samples are then surplus)."""
    scored = sum(1 for r in members if r.status in ("completed", "incomplete"))
    return scored >= spec.group_size(round_)


def _cancel_surplus(spec: BatchCreate, batch: Batch) -> list[str]:
    """With ``overprovision``: the rollouts of rounds already satisfied that have not
    ended, recorded in ``batch.surplus`` and returned to be cancelled."""
    rounds: dict[tuple[str, str, int], list[Rollout]] = defaultdict(list)
    for r in batch.rollouts:
        rounds[(r.domain, r.task_id, r.round)].append(r)
    surplus = []
    for (_, _, round_), members in rounds.items():
        if not _satisfied(spec, round_, members):
            continue
        for r in members:
            if not terminal(r) and r.job_id not in batch.surplus:
                batch.surplus.append(r.job_id)
                surplus.append(r.job_id)
    return surplus


def _over_budget(spec: BatchCreate, batch: Batch) -> str | None:
    budget = spec.budget
    if budget.max_jobs is not None and len(batch.rollouts) + len(batch.stale) >= budget.max_jobs:
        return f"budget.max_jobs ({budget.max_jobs}) jobs were sent"
    if budget.max_tokens is not None and batch.tokens >= budget.max_tokens:
        return (
            f"the rollouts spent {batch.tokens} tokens of budget.max_tokens ({budget.max_tokens})"
        )
    return None


def _fill(spec: BatchCreate, batch: Batch, wanted: list[Sample]) -> list[Sample]:
    in_flight = Counter(r.domain for r in batch.rollouts if not terminal(r))
    room = spec.max_in_flight - sum(in_flight.values())
    if spec.budget.max_jobs is not None:
        room = min(room, spec.budget.max_jobs - len(batch.rollouts) - len(batch.stale))
    queues: dict[str, list[Sample]] = defaultdict(list)
    for sample in _ordered(spec, batch, wanted):
        queues[spec.tasks[sample.task].domain].append(sample)
    weights = {d: weight(spec, batch, d) for d in queues}
    total = sum(weights.values())
    # Rounded up, so that the caps leave no room of the window unused (the window itself
    # bounds the sum), and at least one, so that no domain with samples left starves; the
    # next sample goes to the fewest in flight for its weight.
    cap = {d: max(1, math.ceil(spec.max_in_flight * weights[d] / total)) for d in queues}
    start: list[Sample] = []
    while room > 0:
        open_ = [d for d in queues if queues[d] and in_flight[d] < cap[d]]
        if not open_:
            break
        domain = min(open_, key=lambda d: (in_flight[d] / weights[d], d))
        start.append(queues[domain].pop(0))
        in_flight[domain] += 1
        room -= 1
    return start


def _ordered(spec: BatchCreate, batch: Batch, wanted: list[Sample]) -> list[Sample]:
    """``wanted`` in the order they should start: as planned (task by task), or with
    ``adaptive.variance_first`` round 1's samples first, then the extra samples of the
    tasks whose rewards vary most."""
    if spec.adaptive is None or not spec.adaptive.variance_first:
        return wanted
    by_task = _by_task(batch)
    spreads: dict[int, float] = {}

    def spread(sample: Sample) -> float:
        if sample.task not in spreads:
            task = spec.tasks[sample.task]
            spreads[sample.task] = variance(by_task[(task.domain, task.task_id)])
        return spreads[sample.task]

    return sorted(wanted, key=lambda s: (s.round > 1, -spread(s) if s.round > 1 else 0.0))


def _withdraw_stale(spec: BatchCreate, batch: Batch) -> list[str]:
    """The rollouts more than ``max_staleness`` versions behind the batch's policy version
    that have not started (or, with ``cancel_stale_running``, have not ended): moved to
    ``batch.stale`` (their samples are wanted again, under the current version) and
    returned to be cancelled."""
    assert spec.max_staleness is not None
    oldest = batch.policy_version - spec.max_staleness
    withdrawn: list[str] = []
    room: int | None = None
    for r in list(batch.rollouts):
        if terminal(r) or r.policy_version is None or r.policy_version >= oldest:
            continue
        if room is None:
            # Each sample may run again, but the batch's jobs at most double: a trainer
            # that announces versions without end does not make it run without end.
            room = len(_planned(spec, batch)) - len(batch.stale)
        if len(withdrawn) >= room:
            break
        if r.status != "queued" and not spec.cancel_stale_running:
            continue
        batch.rollouts.remove(r)
        batch.stale.append(r)
        batch.skips.append(
            Skip(
                domain=r.domain,
                task_id=r.task_id,
                reason="stale",
                detail=f"sample {r.sample} ({r.status}) was of policy version "
                f"{r.policy_version}, more than {spec.max_staleness} behind "
                f"{batch.policy_version}: it runs again",
            )
        )
        withdrawn.append(r.job_id)
    return withdrawn


# A domain's median counts once this many of its rollouts were scored.
TAIL_MIN_SCORED = 5


def _cut_tail(factor: float, batch: Batch, now: float) -> list[str]:
    """The running rollouts that have held their slot over ``factor`` times their
    domain's median scored rollout: recorded (``cut``, a skip saying why) and returned to
    be cancelled."""
    runs: dict[str, list[float]] = defaultdict(list)
    for r in batch.rollouts:
        if r.status in ("completed", "incomplete") and r.started_at and r.ended_at:
            runs[r.domain].append(r.ended_at - r.started_at)
    cut = []
    for r in batch.rollouts:
        if terminal(r) or r.started_at is None or r.job_id in batch.cut:
            continue
        mine = runs.get(r.domain, [])
        if len(mine) < TAIL_MIN_SCORED:
            continue
        median = max(statistics.median(mine), 1.0)  # whole seconds: a 0 s median is 1 s
        held = now - r.started_at
        if held > factor * median:
            batch.cut.append(r.job_id)
            batch.skips.append(
                Skip(
                    domain=r.domain,
                    task_id=r.task_id,
                    reason="tail_cut",
                    detail=f"sample {r.sample} (round {r.round}) held its slot {held:.0f} s, "
                    f"over {factor:g}x its domain's median rollout ({median:.0f} s)",
                )
            )
            cut.append(r.job_id)
    return cut


def _remove_failing_domains(batch: Batch) -> None:
    ended: dict[str, Counter[str]] = defaultdict(Counter)
    for rollout in batch.rollouts:
        if rollout.status in ("completed", "incomplete"):
            ended[rollout.domain]["scored"] += 1
        elif rollout.status == "failed" and rollout.error_code in INFRA_FAILURES:
            ended[rollout.domain]["infra"] += 1
    for domain, counts in ended.items():
        if domain in batch.removed_domains:
            continue
        if counts["infra"] >= 3 and counts["infra"] > counts["scored"]:
            batch.removed_domains[domain] = (
                f"{counts['infra']} of its rollouts failed for their environment "
                f"(against {counts['scored']} that ran)"
            )
            batch.skips.append(
                Skip(domain=domain, reason="domain_removed", detail=batch.removed_domains[domain])
            )
