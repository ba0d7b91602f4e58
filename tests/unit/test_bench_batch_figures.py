"""The batch mode's figures (``tiergate bench jobs --batch``) from synthetic rollouts: no
servers; the full run is the benchmark itself."""

from __future__ import annotations

import pytest

from tiergate.bench.jobs.batch import SHORT_BATCH, BatchBenchParams
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
from tiergate.bench.jobs.figures import JobTimeline, slots_average


def span(domain: str, created: float, started: float | None, ended: float | None) -> RolloutSpan:
    status = None if ended is None else "completed"
    return RolloutSpan(f"{domain}-{created}", domain, created, started, ended, status)


# Two quick domains (2 s rollouts, two at a time each) and a slow one (20 s, two at a time):
# the quick ones' last samples are created at 8 s and 9 s, so every domain had samples
# left until 8 s.
QUICK_A = [span("a", t, t + 0.5, t + 2.5) for t in (0.0, 0.0, 2.5, 2.5, 5.0, 5.0, 8.0)]
QUICK_B = [span("b", t, t + 0.5, t + 2.5) for t in (0.0, 0.0, 3.0, 3.0, 6.0, 9.0)]
SLOW = [span("slow", 0.0, 0.5, 20.5), span("slow", 0.0, 0.5, 20.5), span("slow", 20.5, 21, 41)]
SPANS = QUICK_A + QUICK_B + SLOW


def test_contention_ends_when_the_first_domain_has_no_sample_left_to_start() -> None:
    assert contention_end(SPANS) == 8.0
    # A domain with a sample never created had samples left throughout.
    never_b = RolloutSpan("x", "b", None, None, None)
    assert contention_end([*QUICK_B, never_b, *SLOW]) == 20.5
    assert contention_end([*QUICK_A, never_b]) == 8.0
    assert contention_end([never_b, RolloutSpan("y", "a", None, None, None)]) is None
    assert contention_end([]) is None


def test_slot_seconds_count_only_the_window_and_running_rollouts() -> None:
    held = slot_seconds(SPANS, 0.0, 8.0)
    # a: 0.5-2.5 twice, 3-5 twice, 5.5-7.5 twice = 12 s; b: 0.5-2.5 twice, 3.5-5.5 twice,
    # 6.5-8 (clipped) = 9.5 s; slow: 0.5-8 twice = 15 s.
    assert held == pytest.approx({"a": 12.0, "b": 9.5, "slow": 15.0})
    share = shares(held)
    assert share["slow"] == pytest.approx(15.0 / 36.5)
    assert sum(v or 0.0 for v in share.values()) == pytest.approx(1.0)
    # Not picked up: no slot; picked up and not ended: holds it to the window's end.
    assert slot_seconds([span("c", 0, None, None), span("d", 0, 1.0, None)], 0, 5) == {
        "c": 0.0,
        "d": 4.0,
    }


def test_shares_of_weights_and_of_nothing() -> None:
    assert shares({"a": 1.0, "b": 1.0, "slow": 2.0}) == {"a": 0.25, "b": 0.25, "slow": 0.5}
    assert shares({"a": 0.0}) == {"a": None}


def test_peak_running_per_domain_within_the_window() -> None:
    assert peak_running(SPANS, 0.0, 8.0) == {"a": 2, "b": 2, "slow": 2}
    # One ending as the next starts does not overlap it.
    back_to_back = [span("a", 0, 0, 1), span("a", 0, 1, 2), span("a", 0, 1.5, 3)]
    assert peak_running(back_to_back, 0, 10) == {"a": 2}
    assert peak_running([span("a", 0, None, None)], 0, 10) == {"a": 0}


def test_longest_gap_between_sample_starts() -> None:
    assert longest_start_gap(SPANS) == {"seconds": 11.5, "from": 9.0, "to": 20.5}
    assert longest_start_gap(QUICK_A[:1]) == {"seconds": 0.0, "from": None, "to": None}


def test_time_to_last_and_rollouts_per_minute_per_slot() -> None:
    assert time_to_last(SPANS, 0.0) == 41.0
    assert time_to_last([span("a", 0, None, None)], 0.0) is None
    # 16 rollouts in 40 s on 4 slots: 24 a minute, 6 per slot.
    assert per_minute_per_slot(16, 40.0, 4.0) == pytest.approx(6.0)
    assert per_minute_per_slot(16, None, 4.0) is None
    assert per_minute_per_slot(16, 40.0, 0.0) is None
    # Slots averaged to the last rollout: 2 for 10 s, 6 for 20 s, 4 for 10 s.
    assert slots_average([(0.0, 2), (10.0, 6), (30.0, 4)], 40.0) == pytest.approx(4.5)


def test_a_rollout_span_from_its_job_record() -> None:
    job = JobTimeline(
        "j",
        accepted_ms=100_500,
        events=[
            {"type": "job.queued", "created_at": 100},
            {"type": "job.in_progress", "created_at": 101, "run": 2},
            {"type": "job.completed", "created_at": 104},
        ],
        status="completed",
        passed=True,
        run=2,
        leases={1: 100.7, 2: 101.2},
        last_entry_at=104.6,
    )
    got = rollout_span(job, "slow")
    assert (got.created, got.started, got.ended, got.status) == (100.5, 101.2, 104.6, "completed")
    # The terminal event (whole seconds) when it is later than the trajectory's last entry.
    floored = JobTimeline(
        "k", 0, [{"type": "job.failed", "created_at": 7}], status="failed", run=1,
        leases={1: 5.0}, last_entry_at=6.5,
    )  # fmt: skip
    assert rollout_span(floored, "a").ended == 7.0
    lost = rollout_span(JobTimeline("l", 0, []), "a")
    assert (lost.created, lost.started, lost.ended, lost.status) == (None, None, None, None)


def test_domain_figures_count_statuses_and_run_times() -> None:
    figures = domain_figures([*SLOW, span("slow", 30, None, None)])
    assert figures["slow"]["counts"] == {"completed": 3, "lost": 1}
    assert figures["slow"]["run_s"]["max"] == 20.0
    assert figures["slow"]["run_s"]["n"] == 3


def test_the_batch_plan_has_a_slow_domain_and_fits_the_fleet() -> None:
    plan = BatchBenchParams(domains=3, tasks_per_domain=2, samples=4, task_seconds=1.5)
    tasks = plan.tasks()
    assert plan.domain_names() == ["quick-1", "quick-2", "slow"]
    assert len(tasks) == 6 and plan.rollouts == 24
    assert {t["instruction"] for t in tasks if t["domain"] == "slow"} == {"sleep 15 && touch done"}
    assert {t["instruction"] for t in tasks if t["domain"] == "quick-1"} == {
        "sleep 1.5 && touch done"
    }
    assert len({(t["domain"], t["task_id"]) for t in tasks}) == len(tasks)
    assert plan.max_in_flight == 8
    assert SHORT_BATCH.command() == "tiergate bench jobs --batch --short"
    assert "--samples 4" in plan.command()


def test_the_report_names_the_figures() -> None:
    domain = {"slot_seconds": 15.0, "share": 0.411, "weight_share": 0.333, "peak_running": 2}
    report = {
        "command": "tiergate bench jobs --batch --short",
        "cpu": "Intel(R) Xeon(R) Processor",
        "cores": 2,
        "parameters": {
            "domains": {"slow": {"tasks": 2, "command": "sleep 10 && touch done", "weight": 1.0}},
            "samples_per_task": 2,
            "max_in_flight": 4,
            "max_workers": 2,
            "batch_poll_seconds": 0.5,
            "concurrency_per_worker": 2,
            "drain_seconds": 10.0,
            "churn_seconds": 10.0,
        },
        "broker_restart": {"at_s": 20.1, "took_s": 4.2, "ended_before": 6},
        "batch": {"status": "completed"},
        "rollouts": 4,
        "ended": 4,
        "time_to_last_rollout_s": 41.0,
        "slots_average": 3.5,
        "rollouts_per_minute": 5.85,
        "rollouts_per_minute_per_slot": 1.67,
        "lost": 0,
        "failed": 0,
        "run_twice": 0,
        "rerun_after_worker_left": 0,
        "workers_started": 2,
        "workers_unhealthy_at_removal": [],
        "workers_killed_after_drain": [],
        "contention": {
            "until_s": 8.0,
            "fleet_slot_seconds": 32.0,
            "held_slot_seconds": 15.0,
            "peak_running": 2,
            "domains": {"slow": domain},
        },
        "domains": domain_figures(SLOW),
        "fleet_changes": [{"at_s": 10.0, "pid": 1, "workers": 2}],
        "longest_start_gap": {"seconds": 11.5, "from": 9.0, "to": 20.5},
        "scheduler_runs": [{"epoch": 1, "holder": "h:1:batches", "at_s": 0.4}],
        "evidence": {"lost": [], "failed": {}, "run_twice": {}, "rerun": {}},
    }
    text = render(report)
    assert "| time to the last rollout (submission to its end) | 41.0 s |" in text
    assert "1.67 rollouts/min per slot" in text
    assert "| `slow` | completed 3 | 20.00 / 20.00 s | 15.0 | 41.1% | 33.3% | 2 |" in text
    assert "broker restarted at 20.1 s" in text
    assert "held 15.0 of the fleet's 32.0 slot-seconds (at most 2 running" in text
    assert "0.4 s: h:1:batches" in text and "11.5 s (9.0 s to 20.5 s)" in text
