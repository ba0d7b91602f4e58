"""The jobs benchmark's figures, computed from what the job store recorded of each job.

Two clocks are available, and each figure says which it uses:
- events (``job.queued``, ``job.in_progress``, ``job.step``): ``created_at`` in whole
  seconds (floored), so a difference of two is good to about 1 s;
- the run's lease (``runs/NNNN``, written when a worker picks the job up, with the time to
  the millisecond), the job's ``created_ms`` (accepted) and the trajectory's command entry
  (``ts`` when it ended, ``seconds`` it took): millisecond figures.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class JobTimeline:
    """One job as the store recorded it."""

    id: str
    accepted_ms: int
    events: list[dict[str, Any]]
    status: str | None = None  # the terminal record's status; None: no terminal record
    passed: bool | None = None
    run: int | None = None  # the run the terminal record names
    leases: dict[int, float] = field(default_factory=dict)  # epoch -> time it was taken
    first_command_started: float | None = None  # the counting run's, from its trajectory
    last_entry_at: float | None = None  # the counting run's trajectory's last entry (ts)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("type") == kind]

    @property
    def runs(self) -> list[Any]:
        """The ``run`` of each ``job.in_progress`` event, in order."""
        return [e.get("run") for e in self.of("job.in_progress")]


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) with linear interpolation between ranks; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def spread(values: list[float]) -> dict[str, Any]:
    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 3)

    return {
        "n": len(values),
        "p50": r(percentile(values, 0.5)),
        "p95": r(percentile(values, 0.95)),
        "max": r(max(values, default=None)),
    }


def queue_waits_events(jobs: list[JobTimeline]) -> list[float]:
    """``job.queued`` to the first ``job.in_progress``, seconds (event clock)."""
    waits = []
    for job in jobs:
        queued, started = job.of("job.queued"), job.of("job.in_progress")
        if queued and started:
            waits.append(float(started[0]["created_at"] - queued[0]["created_at"]))
    return waits


def queue_waits_leases(jobs: list[JobTimeline]) -> list[float]:
    """Accepted (``created_ms``) to the first run's lease being taken, seconds."""
    return [j.leases[1] - j.accepted_ms / 1000 for j in jobs if 1 in j.leases]


def pickup_to_first_step(jobs: list[JobTimeline]) -> list[float]:
    """The counting run's ``job.in_progress`` to the first ``job.step`` after it, seconds
    (event clock). A step is recorded when its command has ended, so this spans the model's
    first answer through the gateway and the command running."""
    spans = []
    for job in jobs:
        started = [e for e in job.of("job.in_progress") if e.get("run") == job.run]
        if not started:
            continue
        at = started[-1]["created_at"]
        index = job.events.index(started[-1])
        steps = [e for e in job.events[index:] if e.get("type") == "job.step"]
        if steps:
            spans.append(float(steps[0]["created_at"] - at))
    return spans


def pickup_to_first_command(jobs: list[JobTimeline]) -> list[float]:
    """The counting run's lease taken to its first agent command starting in the sandbox
    (the trajectory's end time less its duration), seconds: the pickup's reads, the
    sandbox, and the model's first answer through the gateway."""
    return [
        j.first_command_started - j.leases[j.run]
        for j in jobs
        if j.run is not None and j.run in j.leases and j.first_command_started is not None
    ]


def longest_pickup_gap(jobs: list[JobTimeline]) -> dict[str, Any]:
    """The longest stretch without a pickup (``job.in_progress`` of any job and run) while
    some job waited for its first one: between two consecutive pickups, from the later of
    the first and the earliest ``job.queued`` of the jobs still waiting at the second (or
    never picked up), to the second; seconds, and when (event clock)."""
    pickups = sorted(e["created_at"] for j in jobs for e in j.of("job.in_progress"))
    waiting: list[tuple[int, int | None]] = []
    for job in jobs:
        queued, started = job.of("job.queued"), job.of("job.in_progress")
        if queued:
            waiting.append((queued[0]["created_at"], started[0]["created_at"] if started else None))
    best: dict[str, Any] = {"seconds": 0, "from": None, "to": None}
    for a, b in itertools.pairwise(pickups):
        since = [q for q, s in waiting if q < b and (s is None or s >= b)]
        if since and b - max(a, min(since)) > best["seconds"]:
            start = max(a, min(since))
            best = {"seconds": b - start, "from": start, "to": b}
    return best


def run_twice(job: JobTimeline) -> list[str]:
    """Why ``job`` looks run twice (empty: it does not): two ``job.in_progress`` events of
    one run; a run (a lease taken) with no ``job.in_progress`` of its own, or a terminal
    record naming a run that never reported in progress; more command steps than runs (the
    stub gives each run one command)."""
    reasons = []
    repeated = [run for run, n in Counter(job.runs).items() if n > 1]
    if repeated:
        reasons.append(f"run {repeated} has {len(job.runs)} in_progress events: {job.runs}")
    runs = max(job.leases, default=0)
    if runs > len(job.runs):
        reasons.append(f"{runs} runs (leases) but {len(job.runs)} in_progress events")
    if job.run is not None and job.run not in job.runs:
        reasons.append(f"the terminal record names run {job.run}, in_progress runs {job.runs}")
    steps = len(job.of("job.step"))
    if steps > max(len(set(job.runs)), 1):
        reasons.append(f"{steps} command steps for {len(set(job.runs))} run(s)")
    return reasons


def tally(jobs: list[JobTimeline]) -> dict[str, Any]:
    """Lost (no terminal record), failed (a terminal record other than completed with the
    verifier passed), run twice (:func:`run_twice`) and re-run (more than one run: expected
    when a worker leaves with a job), each with the jobs' ids and evidence."""
    lost = [j.id for j in jobs if j.status is None]
    failed = {
        j.id: {"status": j.status, "passed": j.passed}
        for j in jobs
        if j.status is not None and (j.status != "completed" or j.passed is not True)
    }
    twice = {j.id: reasons for j in jobs if (reasons := run_twice(j))}
    rerun = {j.id: j.runs for j in jobs if len(set(j.runs)) > 1}
    return {
        "lost": len(lost),
        "failed": len(failed),
        "run_twice": len(twice),
        "rerun_after_worker_left": len(rerun),
        "evidence": {"lost": lost, "failed": failed, "run_twice": twice, "rerun": rerun},
    }


def suspect_events(jobs: list[JobTimeline], evidence: dict[str, Any]) -> dict[str, Any]:
    """The events and leases of the jobs :func:`tally` found lost or run twice."""
    suspects = set(evidence["run_twice"]) | set(evidence["lost"])
    return {
        j.id: {
            "events": [
                {k: e.get(k) for k in ("type", "created_at", "run", "attempt", "step")}
                for e in j.events
            ],
            "leases": j.leases,
        }
        for j in jobs
        if j.id in suspects
    }


def slots_average(samples: list[tuple[float, int]], end: float) -> float:
    """The time-weighted mean of a step function: ``(time, slots from then on)`` samples
    in time order, up to ``end``."""
    if not samples:
        return 0.0
    total = 0.0
    for (t, slots), (t_next, _) in itertools.pairwise([*samples, (end, 0)]):
        total += slots * max(0.0, min(t_next, end) - t)
    span = end - samples[0][0]
    return total / span if span > 0 else float(samples[-1][1])
