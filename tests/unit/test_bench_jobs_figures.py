"""The jobs benchmark's figures from synthetic job records (the full run is
``tiergate bench jobs``; this checks only the arithmetic and the run-twice rules)."""

from __future__ import annotations

from typing import Any

from tiergate.bench.jobs.figures import (
    JobTimeline,
    longest_pickup_gap,
    percentile,
    pickup_to_first_command,
    pickup_to_first_step,
    queue_waits_events,
    queue_waits_leases,
    run_twice,
    slots_average,
    spread,
    tally,
)
from tiergate.bench.stub_model import reply_for


def ev(kind: str, at: int, **data: Any) -> dict[str, Any]:
    return {"type": f"job.{kind}", "created_at": at, **data}


def job(job_id: str, queued: int, runs: list[tuple[int, int]], **fields: Any) -> JobTimeline:
    """A completed job queued at ``queued`` whose runs (run, pickup time) each step one
    second after their pickup."""
    events = [ev("queued", queued)]
    for run, at in runs:
        events += [ev("in_progress", at, run=run), ev("step", at + 1, step=1)]
    defaults: dict[str, Any] = {
        "status": "completed",
        "passed": True,
        "run": runs[-1][0] if runs else None,
        "leases": {run: at + 0.25 for run, at in runs},
    }
    return JobTimeline(job_id, queued * 1000, events, **{**defaults, **fields})


def test_percentiles_interpolate_between_ranks() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.5
    assert percentile(values, 0.95) == 95.05
    assert percentile([], 0.5) is None
    assert percentile([7.0], 0.95) == 7.0
    assert spread([3.0, 1.0, 2.0]) == {"n": 3, "p50": 2.0, "p95": 2.9, "max": 3.0}


def test_queue_waits_and_pickup_spans() -> None:
    jobs = [
        job("a", 100, [(1, 102)]),
        job("b", 100, [(1, 105)], first_command_started=105.75),
        job("c", 101, [(1, 103), (2, 140)], first_command_started=140.5),
        job("lost", 101, [], status=None, passed=None),
    ]
    assert queue_waits_events(jobs) == [2.0, 5.0, 2.0]
    assert queue_waits_leases(jobs) == [2.25, 5.25, 2.25]
    # The counting run's pickup: c's second run.
    assert pickup_to_first_step(jobs) == [1.0, 1.0, 1.0]
    assert pickup_to_first_command(jobs) == [0.5, 0.25]


def test_the_longest_gap_counts_only_while_a_job_still_waited() -> None:
    jobs = [
        job("a", 0, [(1, 1)]),
        job("b", 0, [(1, 3)]),
        # Nothing waited between 3 and 50: no gap is counted there.
        job("c", 50, [(1, 51)]),
        # d and e waited from 52; nothing was picked up from 51 until 60.
        job("d", 52, [(1, 60)]),
        job("e", 52, [(1, 61)]),
    ]
    assert longest_pickup_gap(jobs) == {"seconds": 8, "from": 52, "to": 60}
    # A job never picked up keeps the gaps after its acceptance counted.
    never = job("never", 2, [], status=None)
    assert longest_pickup_gap([*jobs, never]) == {"seconds": 48, "from": 3, "to": 51}


def test_run_twice_rules() -> None:
    assert run_twice(job("ok", 0, [(1, 1)])) == []
    assert run_twice(job("rerun", 0, [(1, 1), (2, 40)])) == []
    same = job("same", 0, [(1, 1), (1, 2)])
    assert run_twice(same) and "run [1]" in run_twice(same)[0]
    silent = job("silent", 0, [(1, 1)], leases={1: 1.0, 2: 30.0})
    assert any("2 runs (leases)" in r for r in run_twice(silent))
    unnamed = job("unnamed", 0, [(1, 1)], run=2, leases={1: 1.0})
    assert any("names run 2" in r for r in run_twice(unnamed))
    steps = job("steps", 0, [(1, 1)])
    steps.events.append(ev("step", 3, step=1))
    assert any("2 command steps for 1 run" in r for r in run_twice(steps))


def test_tally_separates_lost_failed_run_twice_and_rerun() -> None:
    jobs = [
        job("ok", 0, [(1, 1)]),
        job("rerun", 0, [(1, 1), (2, 40)]),
        job("twice", 0, [(1, 1), (1, 2)]),
        job("failed", 0, [(1, 1)], passed=False),
        job("incomplete", 0, [(1, 1)], status="incomplete"),
        job("lost", 0, [], status=None, passed=None),
    ]
    counts = tally(jobs)
    assert (counts["lost"], counts["failed"], counts["run_twice"]) == (1, 2, 1)
    assert counts["rerun_after_worker_left"] == 1
    assert counts["evidence"]["lost"] == ["lost"]
    assert set(counts["evidence"]["failed"]) == {"failed", "incomplete"}
    assert counts["evidence"]["rerun"] == {"rerun": [1, 2]}


def test_slots_are_averaged_over_time() -> None:
    # 2 slots for 10 s, 4 for 10 s, 2 for 20 s: (20 + 40 + 40) / 40.
    assert slots_average([(0.0, 2), (10.0, 4), (20.0, 2)], 40.0) == 2.5
    assert slots_average([], 10.0) == 0.0


def test_the_stub_model_gives_the_instruction_as_one_command_then_done() -> None:
    first = [{"role": "system", "content": "s"}, {"role": "user", "content": "touch done"}]
    assert reply_for(first) == "```bash\ntouch done\n```"
    later = [*first, {"role": "assistant", "content": "x"}, {"role": "user", "content": "0"}]
    assert reply_for(later) == "DONE"
