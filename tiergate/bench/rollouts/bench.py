"""``tiergate bench rollouts``: one heavy-tailed rollout batch run twice on the same
servers, once with each task going on alone (``schedule: per_task``) and once with the
batch-wide round barrier (``schedule: rounds``), and the figures side by side
(:mod:`.figures`; report and plot: :mod:`.report`).

The stand-in model (``tiergate.bench.stub_model``) gives each task's instruction back as
its one command, so a rollout's time is its command's and the stack's, not a model's:
the real model would only add noise to a comparison of schedulers. Each command sleeps
and then flips a coin for its verifier (a mixed task goes on to its next round, one
whose samples all agree is saturated). A warm-up batch of quick tasks measures the
median rollout on this machine first; the slow tasks' sleep is then chosen so that
their rollouts take ``slow_factor`` times that median (nothing here is a constant of the
processor). The per-task schedule runs first, on the servers the warm-up warmed.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tiergate.bench.gateway import cpu_model
from tiergate.bench.jobs.batch_figures import rollout_span
from tiergate.bench.jobs.fleet import CONCURRENCY
from tiergate.bench.jobs.stack import JobsStack, keep_logs, new_work_dir, say, timeline
from tiergate.bench.report import write_report
from tiergate.bench.rollouts.figures import GroupSpan, figures
from tiergate.bench.rollouts.report import render
from tiergate.bench.stub_model import MODEL
from tiergate.jobs.state.store import JobStore
from tiergate.jobsclient.models import Batch
from tiergate.jobsclient.sync import JobsClient

SCHEDULES = ("per_task", "rounds")
# The verifier's coin: a sample passes half the time.
_COIN = "test $(( $(od -An -N1 -tu1 /dev/urandom) % 2 )) -eq 0 && touch done; true"


@dataclass(frozen=True)
class RolloutBenchParams:
    tasks: int = 40
    slow_share: float = 0.05  # of the tasks, taking slow_factor times the median rollout
    slow_factor: float = 10.0
    samples: int = 4
    rounds: int = 3
    task_seconds: float = 1.0  # a quick task's sleep
    workers: int = 2  # of CONCURRENCY slots each
    # max_in_flight per slot: above 1 a job waits in the queue for each slot, so that a
    # slot is not idle between a rollout's end and the scheduler's next pass.
    in_flight_per_slot: int = 2
    first_n: int = 10
    deadline_seconds: float = 1200.0
    short: bool = False

    @property
    def slots(self) -> int:
        return self.workers * CONCURRENCY

    @property
    def max_in_flight(self) -> int:
        return self.slots * self.in_flight_per_slot

    @property
    def slow_tasks(self) -> int:
        return max(1, round(self.tasks * self.slow_share))

    def command(self) -> str:
        if self.short:
            return "tiergate bench rollouts --short"
        return (
            f"tiergate bench rollouts --tasks {self.tasks} --slow-share {self.slow_share:g} "
            f"--slow-factor {self.slow_factor:g} --samples {self.samples} --rounds {self.rounds} "
            f"--workers {self.workers}"
        )


SHORT = RolloutBenchParams(
    tasks=6, slow_share=0.17, slow_factor=5.0, samples=2, rounds=2, workers=1, short=True
)


def _task(task_id: str, seconds: float) -> dict[str, Any]:
    return {
        "model": MODEL,
        "instruction": f"sleep {seconds:.2f} && {_COIN}",
        "limits": {"max_steps": 3, "timeout_seconds": 300},
        "verifier": {"command": "test -f done"},
        "domain": "bench",
        "task_id": task_id,
    }


def tasks(params: RolloutBenchParams, slow_seconds: float) -> list[dict[str, Any]]:
    """The quick tasks, then the slow ones (their ids say which)."""
    quick = params.tasks - params.slow_tasks
    return [_task(f"quick-{i}", params.task_seconds) for i in range(quick)] + [
        _task(f"slow-{i}", slow_seconds) for i in range(params.slow_tasks)
    ]


def _spans(
    store: JobStore, batch: Batch, submitted: float, lease_seconds: float
) -> list[GroupSpan]:
    def rel(t: float | None) -> float | None:
        return None if t is None else t - submitted

    spans = []
    for r in batch.rollouts:
        span = rollout_span(timeline(store, r.job_id, lease_seconds), r.domain)
        spans.append(
            GroupSpan(r.task_id, r.round, rel(span.created), rel(span.started), rel(span.ended))
        )
    return spans


def _run(
    client: JobsClient,
    store: JobStore,
    lease_seconds: float,
    batch_tasks: list[dict[str, Any]],
    params: RolloutBenchParams,
    schedule: str,
    samples: int,
    rounds: int,
) -> tuple[Batch, list[GroupSpan]]:
    submitted = time.time()
    batch = client.submit_batch(
        batch_tasks,
        samples_per_task=samples,
        rounds=rounds,
        schedule=schedule,
        max_in_flight=params.max_in_flight,
    )
    seen = {"ended": -1}

    def progress(b: Batch) -> None:
        ended = sum(1 for r in b.rollouts if r.status in ("completed", "incomplete", "failed"))
        if ended != seen["ended"] and (ended % 10 == 0 or b.finished):
            say(f"[{schedule}] {ended}/{len(b.rollouts)} rollouts ended, round {b.round}")
        seen["ended"] = ended

    final = client.wait_batch(batch.id, params.deadline_seconds, progress, poll_seconds=1.0)
    return final, _spans(store, final, submitted, lease_seconds)


def run_rollouts_benchmark(out: Path, params: RolloutBenchParams) -> dict[str, Any]:
    """Warm-up, then each schedule's batch; writes ``rollouts-bench.{json,md}`` (the
    command draws the figure)."""
    work = new_work_dir()
    cpu = cpu_model()
    say(f"CPU: {cpu}; {params.command()}")
    stack = JobsStack(work, params.slots * 4, "cooperative-sticky", batch_poll_seconds=0.5)
    runs: dict[str, Any] = {}
    try:
        gateway_url, settings = stack.start()
        assert stack.fleet is not None
        for _ in range(params.workers):
            stack.fleet.add()
        store = JobStore(settings.storage)
        lease = settings.worker.lease_seconds
        with JobsClient(base_url=gateway_url) as client:
            say(f"warm-up: {params.slots * 2} quick rollouts measure the median rollout")
            warm = [_task(f"warm-{i}", params.task_seconds) for i in range(params.slots)]
            _, spans = _run(client, store, lease, warm, params, "per_task", 2, 1)
            median = statistics.median(
                s.ended - s.started for s in spans if s.ended is not None and s.started is not None
            )
            overhead = max(0.0, median - params.task_seconds)
            slow_seconds = max(params.task_seconds, params.slow_factor * median - overhead)
            say(f"median rollout {median:.2f} s: the slow tasks sleep {slow_seconds:.1f} s")
            batch_tasks = tasks(params, slow_seconds)
            for schedule in SCHEDULES:
                final, spans = _run(
                    client,
                    store,
                    lease,
                    batch_tasks,
                    params,
                    schedule,
                    params.samples,
                    params.rounds,
                )
                runs[schedule] = {
                    "batch": final.id,
                    "status": final.status,
                    "counts": final.counts,
                    "saturated": sum(1 for s in final.skips if s.reason == "saturated"),
                    **figures(spans, params.slots, params.first_n),
                }
    finally:
        with contextlib.suppress(Exception):
            stack.stop()
        keep_logs(work)
    report = {
        "command": params.command(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "parameters": {
            **asdict(params),
            "slots": params.slots,
            "max_in_flight": params.max_in_flight,
            "slow_tasks": params.slow_tasks,
        },
        "warmup_median_rollout_s": round(median, 2),
        "slow_task_seconds": round(slow_seconds, 1),
        "runs": runs,
        "ratios": _ratios(runs),
    }
    write_report(out, "rollouts-bench", report, render(report))
    return report


def _ratios(runs: dict[str, Any]) -> dict[str, float | None]:
    """per_task over rounds, each figure of the same run."""

    def ratio(key: str) -> float | None:
        a, b = runs["per_task"].get(key), runs["rounds"].get(key)
        return None if not a or not b else round(a / b, 2)

    return {
        "groups_per_minute": ratio("groups_per_minute"),
        "groups_per_minute_to_90pct": ratio("groups_per_minute_to_90pct"),
        "slot_utilization": ratio("slot_utilization_while_samples_remain"),
    }
