"""``tiergate bench jobs``: agent jobs through the whole pipeline while the worker fleet
grows and shrinks and the broker restarts, with what each job's record says happened.

One run starts a SeaweedFS object store and a Tansu broker on it (tiergate.local.servers),
a stub model (:mod:`tiergate.bench.stub_model`: one shell command, then DONE), a gateway
with jobs enabled in front of it (``tiergate serve``) and one ``tiergate worker``; then it
submits the jobs through ``POST /v1/jobs`` and, every ``churn_seconds``, adds or removes
one worker between 1 and ``max_workers`` (up to the most, down to one, up again, as an
autoscaler following a backlog would; removal is SIGTERM, so the worker drains), and once
half the jobs have ended restarts the broker (same port and data). It waits until every job
has a terminal record or the deadline passes, then reads each job's events, run leases and
trajectory from the store (figures: :mod:`tiergate.bench.jobs.figures`). The servers are
:mod:`tiergate.bench.jobs.stack`'s, the churn and the restart
:mod:`tiergate.bench.jobs.churn`'s, which the batch mode (:mod:`tiergate.bench.jobs.batch`)
shares.

Each job's verifier checks the file its command touched (``test -f done``).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tiergate.bench.gateway import cpu_model
from tiergate.bench.jobs.churn import ChurnRecord, churn
from tiergate.bench.jobs.figures import (
    longest_pickup_gap,
    pickup_to_first_command,
    pickup_to_first_step,
    queue_waits_events,
    queue_waits_leases,
    slots_average,
    spread,
    suspect_events,
    tally,
)
from tiergate.bench.jobs.fleet import CONCURRENCY, DRAIN_SECONDS, FleetParams
from tiergate.bench.jobs.report import render
from tiergate.bench.jobs.stack import (
    JobsStack,
    fleet_figures,
    job_body,
    keep_logs,
    new_work_dir,
    say,
    timeline,
)
from tiergate.bench.report import write_report
from tiergate.jobs.state.store import JobStore


@dataclass(frozen=True)
class JobsBenchParams(FleetParams):
    """What one run does."""

    jobs: int = 100
    job_seconds: float = 1.0  # how long each job's command runs (sleep)

    def command(self) -> str:
        parts = ["tiergate bench jobs"]
        if self.short:
            parts.append("--short")
        else:
            parts += [
                f"--jobs {self.jobs}",
                f"--max-workers {self.max_workers}",
                f"--churn-seconds {self.churn_seconds:g}",
                f"--job-seconds {self.job_seconds:g}",
            ]
        if not self.broker_restart:
            parts.append("--no-broker-restart")
        if self.assignment != "cooperative-sticky":
            parts.append(f"--assignment {self.assignment}")
        return " ".join(parts)


# Churn every 10 s: an autoscaler's cadence is slower still (KEDA polls every 30 s by
# default); faster churn than a rebalance takes on Tansu (see the README) stalls pickups.
SHORT = JobsBenchParams(
    jobs=20, max_workers=2, churn_seconds=10.0, deadline_seconds=300.0, short=True
)


def _drive(
    stack: JobsStack, params: JobsBenchParams, gateway_url: str, store: JobStore
) -> tuple[list[str], float, ChurnRecord]:
    """Submit, churn the fleet, restart the broker once, wait; the job ids, the time of the
    first submission and what the fleet did, by the bench's own clock."""
    assert stack.fleet is not None
    say("starting the first worker")
    stack.fleet.add()
    t0, t0_wall = time.monotonic(), time.time()
    say(f"submitting {params.jobs} jobs")
    with httpx.Client(base_url=gateway_url, timeout=30) as client:
        ids = []
        for _ in range(params.jobs):
            resp = client.post("/v1/jobs", json=job_body(params.job_seconds))
            if resp.status_code != 200:
                raise RuntimeError(f"POST /v1/jobs answered {resp.status_code}: {resp.text}")
            ids.append(resp.json()["id"])
    say(f"submitted in {time.monotonic() - t0:.1f} s")
    waiting = set(ids)

    def ended() -> int:
        waiting.difference_update([i for i in waiting if store.final(i) is not None])
        return len(ids) - len(waiting)

    return ids, t0_wall, churn(stack, params, t0, len(ids), ended)


def run_jobs_benchmark(out: Path, params: JobsBenchParams) -> tuple[dict[str, Any], bool]:
    """One run; writes ``jobs-bench.{json,md}`` under ``out``; returns the report and
    whether nothing was lost, failed or run twice."""
    work = new_work_dir()
    cpu = cpu_model()
    say(f"CPU: {cpu}; {params.command()}")
    stack = JobsStack(work, params.jobs, params.assignment)
    try:
        gateway_url, settings = stack.start()
        store = JobStore(settings.storage)
        ids, t0_wall, drove = _drive(stack, params, gateway_url, store)
        fleet = stack.close_fleet()
        say("reading every job's events, leases and trajectory")
        lease_seconds = settings.worker.lease_seconds
        timelines = [timeline(store, i, lease_seconds) for i in ids]
    finally:
        with contextlib.suppress(Exception):
            stack.stop()
        keep_logs(work)
    counts = tally(timelines)
    ended = sum(1 for t in timelines if t.status is not None)
    minutes = drove.seconds / 60
    slots = slots_average(drove.slots, drove.seconds)
    report: dict[str, Any] = {
        "command": params.command(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "parameters": {
            "jobs": params.jobs,
            "max_workers": params.max_workers,
            "churn_seconds": params.churn_seconds,
            "broker_restart": params.broker_restart,
            "deadline_seconds": params.deadline_seconds,
            "job_command": job_body(params.job_seconds)["instruction"],
            "concurrency_per_worker": CONCURRENCY,
            "drain_seconds": DRAIN_SECONDS,
            "lease_seconds": lease_seconds,
            "session_timeout_ms": settings.kafka.session_timeout_ms,
            "partitions": settings.kafka.partitions,
        },
        "seconds": round(drove.seconds, 1),
        "ended": ended,
        "slots_average": round(slots, 2),
        "jobs_per_minute": round(ended / minutes, 2),
        "jobs_per_minute_per_slot": round(ended / minutes / slots, 2),
        "queue_wait_s": {
            "events": spread(queue_waits_events(timelines)),
            "leases": spread(queue_waits_leases(timelines)),
        },
        "pickup_to_first_step_s": spread(pickup_to_first_step(timelines)),
        "pickup_to_first_command_s": spread(pickup_to_first_command(timelines)),
        "longest_pickup_gap": _relative(longest_pickup_gap(timelines), t0_wall),
        **{k: v for k, v in counts.items() if k != "evidence"},
        "evidence": counts["evidence"],
        "fleet_changes": drove.fleet_changes,
        **fleet_figures(fleet),
        "broker_restart": drove.broker_restart,
        # Every pickup, seconds after the first submission: where the gaps are.
        "pickups": sorted(
            [round(e["created_at"] - t0_wall, 1), t.id, e.get("run")]
            for t in timelines
            for e in t.of("job.in_progress")
        ),
    }
    clean = counts["lost"] == counts["failed"] == counts["run_twice"] == 0
    if not clean:
        report["events_of_suspect_jobs"] = suspect_events(timelines, counts["evidence"])
    write_report(out, "jobs-bench", report, render(report))
    return report, clean


def _relative(gap: dict[str, Any], t0_wall: float) -> dict[str, Any]:
    """The gap with its ends also in seconds after the first job's submission (the clock
    the fleet changes and the broker restart are given in)."""
    for end in ("from", "to"):
        at = gap[end]
        gap[f"{end}_s"] = None if at is None else round(at - t0_wall, 1)
    return gap
