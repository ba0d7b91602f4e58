"""The batch mode's figures (``tiergate bench jobs --batch``), from each rollout's job as
the store recorded it (:class:`~tiergate.bench.jobs.figures.JobTimeline`).

Times are epoch seconds: a job's creation (``created_ms``: the batch's scheduler started
the sample), its counting run's lease (the pickup, to the millisecond) and its end (the
later of its trajectory's last entry and its terminal event, which is whole seconds).
A rollout holds a slot from its pickup to its end; a re-run's earlier runs are not
counted (a worker that left drained or gave them up).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tiergate.bench.jobs.figures import JobTimeline, spread


@dataclass(frozen=True)
class RolloutSpan:
    """One rollout: its domain, when its job was created, picked up and ended (None: not
    recorded), and its terminal status (None: no terminal record)."""

    job_id: str
    domain: str
    created: float | None
    started: float | None
    ended: float | None
    status: str | None = None


def rollout_span(job: JobTimeline, domain: str) -> RolloutSpan:
    created = job.accepted_ms / 1000 if job.accepted_ms else None
    started = job.leases.get(job.run) if job.run is not None else None
    ends = [float(e["created_at"]) for e in job.of(f"job.{job.status}")] if job.status else []
    if job.status is not None and job.last_entry_at is not None:
        ends.append(job.last_entry_at)
    return RolloutSpan(job.id, domain, created, started, max(ends, default=None), job.status)


def contention_end(spans: Iterable[RolloutSpan]) -> float | None:
    """When the first domain had no sample left to start: the earliest of the domains'
    last job creations (a domain with a sample never created had samples left
    throughout). None: every domain had samples left to the end."""
    last: dict[str, float] = {}
    for span in spans:
        created = math.inf if span.created is None else span.created
        last[span.domain] = max(last.get(span.domain, -math.inf), created)
    end = min(last.values(), default=math.inf)
    return None if math.isinf(end) else end


def slot_seconds(spans: Iterable[RolloutSpan], start: float, end: float) -> dict[str, float]:
    """Per domain, the seconds its rollouts held a slot within ``[start, end]`` (a rollout
    picked up and not ended holds it to ``end``)."""
    held: dict[str, float] = {}
    for span in spans:
        held.setdefault(span.domain, 0.0)
        if span.started is None:
            continue
        until = end if span.ended is None else min(span.ended, end)
        held[span.domain] += max(0.0, until - max(span.started, start))
    return held


def shares(values: Mapping[str, float]) -> dict[str, float | None]:
    """Each value's part of their sum (None each when the sum is not positive)."""
    total = sum(values.values())
    return {k: (v / total if total > 0 else None) for k, v in values.items()}


def peak_running(spans: Iterable[RolloutSpan], start: float, end: float) -> dict[str, int]:
    """Per domain, the most of its rollouts holding a slot at once within ``[start, end]``
    (one ending and one starting at the same instant do not overlap)."""
    moves: dict[str, list[tuple[float, int]]] = {}
    for span in spans:
        steps = moves.setdefault(span.domain, [])
        if span.started is None:
            continue
        lo, hi = max(span.started, start), end if span.ended is None else min(span.ended, end)
        if hi > lo:
            steps += [(lo, 1), (hi, -1)]
    peaks = {}
    for domain, steps in moves.items():
        running = itertools.accumulate(step for _, step in sorted(steps))
        peaks[domain] = max(running, default=0)
    return peaks


def domain_figures(spans: Iterable[RolloutSpan]) -> dict[str, dict[str, Any]]:
    """Per domain, its rollouts by terminal status (``lost``: none) and how long they held
    a slot."""
    figures: dict[str, dict[str, Any]] = {}
    for span in spans:
        entry = figures.setdefault(span.domain, {"counts": Counter(), "run_s": []})
        entry["counts"][span.status or "lost"] += 1
        if span.started is not None and span.ended is not None:
            entry["run_s"].append(span.ended - span.started)
    return {
        d: {"counts": dict(e["counts"]), "run_s": spread(e["run_s"])} for d, e in figures.items()
    }


def longest_start_gap(spans: Iterable[RolloutSpan]) -> dict[str, float | None]:
    """The longest stretch between two consecutive job creations (the scheduler starting
    samples): ``seconds``, ``from`` and ``to`` (zero and None with fewer than two)."""
    created = sorted(s.created for s in spans if s.created is not None)
    best: dict[str, float | None] = {"seconds": 0.0, "from": None, "to": None}
    for a, b in itertools.pairwise(created):
        if b - a > (best["seconds"] or 0.0):
            best = {"seconds": b - a, "from": a, "to": b}
    return best


def time_to_last(spans: Iterable[RolloutSpan], submitted: float) -> float | None:
    """From ``submitted`` to the last rollout's end; None if none ended."""
    ends = [s.ended for s in spans if s.ended is not None]
    return max(ends) - submitted if ends else None


def per_minute_per_slot(count: int, seconds: float | None, slots: float) -> float | None:
    """``count`` over ``seconds``, per minute and per slot (None without a span)."""
    if not seconds or seconds <= 0 or slots <= 0:
        return None
    return count / (seconds / 60) / slots
