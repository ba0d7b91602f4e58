"""The rollouts benchmark's figures, from each rollout's job as the store recorded it.

A *group* is one task's samples of one round: complete when the last of them has ended,
which is when a trainer could take it. Times are seconds after the batch's submission.
- groups per minute: the groups over the time until the last one completed (the batch's
  makespan), and over the time until 90% of them had (the rate before the tail: the
  slowest task's own chain of rounds bounds the makespan under either schedule);
- slot utilization while samples remain: the slot-seconds rollouts held, over those they
  could have held: at each moment, the slots, or fewer when fewer rollouts were running
  or *eligible* (a round-1 sample from the submission, a later round's sample from the end
  of its own task's previous round) but not yet started. 1.0: no slot was idle while a
  sample could have started; a round barrier loses what its waiting tasks could have run;
- the first group's time against the median rollout's.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GroupSpan:
    """One rollout: its task and round, when its job was created, picked up and ended
    (seconds after the submission; None: not recorded)."""

    task: str
    round: int
    created: float | None
    started: float | None
    ended: float | None


def completions(spans: Iterable[GroupSpan]) -> list[float]:
    """Each complete group's completion time, sorted (a group with a rollout not ended is
    not complete)."""
    groups: dict[tuple[str, int], list[float | None]] = {}
    for span in spans:
        groups.setdefault((span.task, span.round), []).append(span.ended)
    done = [max(e for e in ends if e is not None) for ends in groups.values() if None not in ends]
    return sorted(done)


def eligible(spans: list[GroupSpan]) -> list[float]:
    """When each rollout could have started: round 1's at the submission, a later round's
    when the last of its task's earlier rollouts ended."""
    ends: dict[str, list[tuple[int, float]]] = {}
    for s in spans:
        if s.ended is not None:
            ends.setdefault(s.task, []).append((s.round, s.ended))
    return [
        max((e for r, e in ends.get(s.task, []) if r < s.round), default=0.0)
        if s.round > 1
        else 0.0
        for s in spans
    ]


def utilization(spans: Iterable[GroupSpan], slots: int, step: float = 0.1) -> float | None:
    """Slot-seconds held over the slot-seconds that could have been held (see the module's
    doc), sampled every ``step`` seconds; None when nothing could run."""
    spans = [s for s in spans if s.started is not None]
    if not spans or slots <= 0:
        return None
    ready = eligible(spans)
    end = max((s.ended if s.ended is not None else s.started) or 0.0 for s in spans)
    held = usable = 0.0
    for i in range(math.ceil(end / step)):
        t = (i + 0.5) * step
        running = sum(
            1 for s in spans if s.started is not None and s.started <= t and (s.ended or end) > t
        )
        waiting = sum(
            1
            for s, r in zip(spans, ready, strict=True)
            if s.started is not None and r <= t < s.started
        )
        held += min(running, slots)
        usable += min(slots, running + waiting)
    return held / usable if usable else None


def occupancy(spans: Iterable[GroupSpan], step: float = 1.0) -> list[tuple[float, int]]:
    """Rollouts holding a slot, sampled every ``step`` seconds from the submission."""
    spans = [s for s in spans if s.started is not None]
    end = max((s.ended or s.started or 0.0) for s in spans) if spans else 0.0
    series = []
    for i in range(math.ceil(end / step) + 1):
        t = i * step
        running = sum(
            1
            for s in spans
            if s.started is not None and s.started <= t and (s.ended is None or t < s.ended)
        )
        series.append((round(t, 3), running))
    return series


def figures(spans: list[GroupSpan], slots: int, first_n: int) -> dict[str, Any]:
    """The figures of one schedule's batch."""
    done = completions(spans)
    runs = [s.ended - s.started for s in spans if s.started is not None and s.ended is not None]
    median_run = statistics.median(runs) if runs else None
    n90 = math.ceil(0.9 * len(done)) if done else 0
    last = done[-1] if done else None
    t90 = done[n90 - 1] if done else None

    def per_minute(count: int, seconds: float | None) -> float | None:
        return None if not seconds or seconds <= 0 else round(count / seconds * 60, 2)

    u = utilization(spans, slots)
    return {
        "rollouts": len(spans),
        "groups": len(done),
        "makespan_s": None if last is None else round(last, 1),
        "groups_per_minute": per_minute(len(done), last),
        "time_to_90pct_groups_s": None if t90 is None else round(t90, 1),
        "groups_per_minute_to_90pct": per_minute(n90, t90),
        "first_group_s": round(done[0], 1) if done else None,
        f"first_{first_n}_groups_s": round(done[first_n - 1], 1) if len(done) >= first_n else None,
        "median_rollout_s": None if median_run is None else round(median_run, 2),
        "slot_utilization_while_samples_remain": None if u is None else round(u, 3),
        "completions_s": [round(t, 2) for t in done],
        "occupancy": occupancy(spans),
    }
