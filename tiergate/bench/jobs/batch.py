"""``tiergate bench jobs --batch``: one rollout batch (``POST /v1/jobs/batches``) through
the same servers, churning fleet and broker restart as the jobs mode
(:mod:`tiergate.bench.jobs.bench`), with how the batch's scheduler shared the slots.

The batch has ``domains`` domains of ``tasks_per_domain`` tasks, ``samples`` samples of
each, equal weights and ``max_in_flight`` the slots of the fleet at its largest. Every
task's one command sleeps ``task_seconds`` and touches the file its verifier checks; the
last domain's (``slow``) sleeps ``slow_factor`` times longer. The workers schedule the
batch every ``batch_poll_seconds``. Once every rollout has ended (or the deadline passed)
each rollout's job is read back from the store (figures:
:mod:`tiergate.bench.jobs.batch_figures`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tiergate.bench.gateway import cpu_model
from tiergate.bench.jobs.batch_figures import (
    RolloutSpan,
    contention_end,
    domain_figures,
    longest_start_gap,
    peak_running,
    per_minute_per_slot,
    rollout_span,
    shares,
    slot_seconds,
    time_to_last,
)
from tiergate.bench.jobs.batch_report import render
from tiergate.bench.jobs.churn import ChurnRecord, churn
from tiergate.bench.jobs.figures import slots_average, suspect_events, tally
from tiergate.bench.jobs.fleet import CONCURRENCY, DRAIN_SECONDS, FleetParams
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
from tiergate.jobs.batches.driver import job_id_of
from tiergate.jobs.batches.schedule import terminal
from tiergate.jobs.batches.store import BatchStore
from tiergate.jobs.state.store import JobStore
from tiergate.jobsclient.errors import JobsError
from tiergate.jobsclient.models import Batch
from tiergate.jobsclient.sync import JobsClient


@dataclass(frozen=True)
class BatchBenchParams(FleetParams):
    """What one batch run does."""

    domains: int = 3
    tasks_per_domain: int = 8
    samples: int = 4
    task_seconds: float = 1.0  # how long a task's command runs (sleep); slow: times slow_factor
    slow_factor: float = 10.0
    batch_poll_seconds: float = 0.5

    @property
    def max_in_flight(self) -> int:
        return self.max_workers * CONCURRENCY

    @property
    def rollouts(self) -> int:
        return self.domains * self.tasks_per_domain * self.samples

    def domain_names(self) -> list[str]:
        """The quick domains, then ``slow``."""
        return [f"quick-{i}" for i in range(1, self.domains)] + ["slow"]

    def seconds_of(self, domain: str) -> float:
        return self.task_seconds * (self.slow_factor if domain == "slow" else 1.0)

    def tasks(self) -> list[dict[str, Any]]:
        return [
            {**job_body(self.seconds_of(domain)), "domain": domain, "task_id": f"task-{i}"}
            for domain in self.domain_names()
            for i in range(1, self.tasks_per_domain + 1)
        ]

    def command(self) -> str:
        parts = ["tiergate bench jobs --batch"]
        if self.short:
            parts.append("--short")
        else:
            parts += [
                f"--domains {self.domains}",
                f"--tasks-per-domain {self.tasks_per_domain}",
                f"--samples {self.samples}",
                f"--max-workers {self.max_workers}",
                f"--churn-seconds {self.churn_seconds:g}",
                f"--job-seconds {self.task_seconds:g}",
            ]
        if not self.broker_restart:
            parts.append("--no-broker-restart")
        if self.assignment != "cooperative-sticky":
            parts.append(f"--assignment {self.assignment}")
        return " ".join(parts)


SHORT_BATCH = BatchBenchParams(
    tasks_per_domain=2, samples=2, max_workers=2, deadline_seconds=300.0, short=True
)


class _Progress:
    """Reads the batch (every call: the churn loop's second), says on stderr how far each
    domain is when that changed (at most every 3 s, and at the end); returns how many of
    its rollouts ended."""

    def __init__(self, client: JobsClient, batch_id: str, planned: dict[str, int]) -> None:
        self.client = client
        self.batch_id = batch_id
        self.planned = planned
        self.batch: Batch | None = None
        self.ended = 0
        self._line = ""
        self._said = 0.0

    def __call__(self) -> int:
        try:
            batch = self.batch = self.client.get_batch(self.batch_id)
        except JobsError as exc:
            say(f"batch not read: {exc}")
            return self.ended
        done: Counter[str] = Counter(r.domain for r in batch.rollouts if terminal(r))
        flying: Counter[str] = Counter(r.domain for r in batch.rollouts if not terminal(r))
        self.ended = sum(done.values())
        parts = []
        for domain, planned in self.planned.items():
            rate = batch.domains.get(domain, {}).get("pass_rate")
            shown = "-" if rate is None else f"{rate:.0%}"
            parts.append(
                f"{domain} {done[domain]}/{planned} ({flying[domain]} in flight) pass {shown}"
            )
        line = "; ".join(parts)
        last = self.ended >= sum(self.planned.values())
        if line != self._line and (last or time.monotonic() - self._said >= 3):
            say(f"[{batch.id}] " + line)
            self._line, self._said = line, time.monotonic()
        return self.ended


def _drive(
    stack: JobsStack, params: BatchBenchParams, gateway_url: str
) -> tuple[str, float, ChurnRecord, Batch | None]:
    """Submit the batch, churn the fleet, restart the broker once, wait; the batch's id,
    the time of its submission, what the fleet did and the batch as last read."""
    assert stack.fleet is not None
    say("starting the first worker")
    stack.fleet.add()
    planned = {d: params.tasks_per_domain * params.samples for d in params.domain_names()}
    with JobsClient(base_url=gateway_url) as client:
        t0, t0_wall = time.monotonic(), time.time()
        batch = client.submit_batch(
            params.tasks(),
            samples_per_task=params.samples,
            max_in_flight=params.max_in_flight,
            domain_weights=dict.fromkeys(planned, 1.0),
        )
        say(
            f"batch {batch.id}: {len(planned)} domains of {params.tasks_per_domain} tasks, "
            f"{params.samples} samples each, max_in_flight {params.max_in_flight}"
        )
        progress = _Progress(client, batch.id, planned)
        drove = churn(stack, params, t0, params.rollouts, progress)
        last = progress.batch
        if drove.ended >= params.rollouts:
            # Its scheduler records the end on its next pass.
            with contextlib.suppress(JobsError):
                last = client.wait_batch(batch.id, timeout=60, poll_seconds=0.5)
    return batch.id, t0_wall, drove, last


def _scheduler_runs(
    store: JobStore, batch_id: str, job_ids: list[str], lease_seconds: float, t0_wall: float
) -> list[dict[str, Any]]:
    """Each run of the batch's scheduler lease (one worker schedules it; another takes
    over once that one's lease expires or is released): who took it, when."""
    owner = next((job.owner for i in job_ids if (job := store.get(i)) is not None), None)
    if owner is None:
        return []
    leases = store.leases(lease_seconds)
    lease_id = BatchStore.lease_id(owner, batch_id)
    runs = []
    for epoch in range(1, leases.latest(lease_id) + 1):
        body = store.objects.get(leases.run_key(lease_id, epoch))
        if body is not None:
            holder, taken = body.decode().split()[:2]
            runs.append(
                {"epoch": epoch, "holder": holder, "at_s": round(float(taken) - t0_wall, 1)}
            )
    return runs


def _contention(
    spans: list[RolloutSpan],
    t0_wall: float,
    end: float,
    weights: dict[str, float],
    slots: list[tuple[float, int]],
) -> dict[str, Any]:
    """Slot-time per domain from the submission until the first domain had no sample left
    to start, against the domains' weights; and of the fleet's slot-time then, how much
    rollouts held (``slots``: the fleet's, seconds after the submission)."""
    until = contention_end(spans) or end
    held = slot_seconds(spans, t0_wall, until)
    share, weight = shares(held), shares(weights)
    peak = peak_running(spans, t0_wall, until)
    every = [dataclasses.replace(s, domain="*") for s in spans]
    window = until - t0_wall

    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 3)

    return {
        "until_s": round(window, 1),
        "fleet_slot_seconds": round(slots_average(slots, window) * window, 1),
        "held_slot_seconds": round(sum(held.values()), 1),
        "peak_running": peak_running(every, t0_wall, until).get("*", 0),
        "domains": {
            d: {
                "slot_seconds": round(held.get(d, 0.0), 1),
                "share": r(share.get(d)),
                "weight_share": r(weight[d]),
                "peak_running": peak.get(d, 0),
            }
            for d in weights
        },
    }


def run_batch_benchmark(out: Path, params: BatchBenchParams) -> tuple[dict[str, Any], bool]:
    """One run; writes ``jobs-batch-bench.{json,md}`` under ``out``; returns the report and
    whether no rollout was lost, failed or run twice."""
    work = new_work_dir()
    cpu = cpu_model()
    say(f"CPU: {cpu}; {params.command()}")
    stack = JobsStack(work, params.rollouts, params.assignment, params.batch_poll_seconds)
    try:
        gateway_url, settings = stack.start()
        batch_id, t0_wall, drove, batch = _drive(stack, params, gateway_url)
        fleet = stack.close_fleet()
        say("reading every rollout's events, leases and trajectory")
        store = JobStore(settings.storage)
        lease_seconds = settings.worker.lease_seconds
        tasks = params.tasks()
        planned = [
            (tasks[i]["domain"], job_id_of(batch_id, i, s))
            for i in range(len(tasks))
            for s in range(params.samples)
        ]
        timelines = [timeline(store, job_id, lease_seconds) for _, job_id in planned]
        scheduler = _scheduler_runs(
            store, batch_id, [i for _, i in planned], lease_seconds, t0_wall
        )
    finally:
        with contextlib.suppress(Exception):
            stack.stop()
        keep_logs(work)
    spans = [rollout_span(t, domain) for t, (domain, _) in zip(timelines, planned, strict=True)]
    counts = tally(timelines)
    ended = sum(1 for t in timelines if t.status is not None)
    to_last = time_to_last(spans, t0_wall)
    span_s = to_last if to_last is not None else drove.seconds
    slots = slots_average(drove.slots, span_s)
    per_slot = per_minute_per_slot(ended, to_last, slots)
    weights = dict.fromkeys(params.domain_names(), 1.0)
    report: dict[str, Any] = {
        "command": params.command(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "parameters": {
            "domains": {
                d: {
                    "tasks": params.tasks_per_domain,
                    "command": job_body(params.seconds_of(d))["instruction"],
                    "weight": weights[d],
                }
                for d in params.domain_names()
            },
            "samples_per_task": params.samples,
            "max_in_flight": params.max_in_flight,
            "max_workers": params.max_workers,
            "churn_seconds": params.churn_seconds,
            "broker_restart": params.broker_restart,
            "deadline_seconds": params.deadline_seconds,
            "batch_poll_seconds": params.batch_poll_seconds,
            "concurrency_per_worker": CONCURRENCY,
            "drain_seconds": DRAIN_SECONDS,
            "lease_seconds": lease_seconds,
            "session_timeout_ms": settings.kafka.session_timeout_ms,
            "partitions": settings.kafka.partitions,
        },
        "batch": {
            "id": batch_id,
            "status": None if batch is None else batch.status,
            "completed_after_s": (
                None
                if batch is None or batch.completed_at is None
                else batch.completed_at - int(t0_wall)
            ),
            "counts": None if batch is None else batch.counts,
        },
        "rollouts": params.rollouts,
        "ended": ended,
        "seconds": round(drove.seconds, 1),
        "time_to_last_rollout_s": None if to_last is None else round(to_last, 1),
        "slots_average": round(slots, 2),
        "rollouts_per_minute": None if to_last is None else round(ended / (to_last / 60), 2),
        "rollouts_per_minute_per_slot": None if per_slot is None else round(per_slot, 2),
        "contention": _contention(spans, t0_wall, t0_wall + span_s, weights, drove.slots),
        "domains": domain_figures(spans),
        "longest_start_gap": _relative(longest_start_gap(spans), t0_wall),
        "scheduler_runs": scheduler,
        **{k: v for k, v in counts.items() if k != "evidence"},
        "evidence": counts["evidence"],
        "fleet_changes": drove.fleet_changes,
        **fleet_figures(fleet),
        "broker_restart": drove.broker_restart,
    }
    clean = counts["lost"] == counts["failed"] == counts["run_twice"] == 0
    if not clean:
        report["events_of_suspect_jobs"] = suspect_events(timelines, counts["evidence"])
    write_report(out, "jobs-batch-bench", report, render(report))
    return report, clean


def _relative(gap: dict[str, float | None], t0_wall: float) -> dict[str, float | None]:
    """The gap in seconds after the submission."""
    return {
        k: None if v is None else round(v - (0.0 if k == "seconds" else t0_wall), 1)
        for k, v in gap.items()
    }
