"""The soak's history check (tiergate.bench.soak.check) on made-up histories: each promise
it holds the system to is broken once here, and it must say so."""

from __future__ import annotations

from typing import Any

from tiergate.bench.soak.check import check_batches, check_chat, check_jobs, overlapping, runs_of


def _events(*runs: int | None) -> list[dict[str, Any]]:
    """A job's events as the lifecycle writes them, the run behind each."""
    events: list[dict[str, Any]] = [{"type": "job.queued", "sequence_number": 1}]
    for run in runs:
        events.append({"type": "job.step", "sequence_number": len(events) + 1, "run": run})
    events.append({"type": "job.completed", "job": {"run": runs[-1] if runs else None}})
    return events


def test_runs_are_read_from_every_event_that_names_one_and_the_terminal_job() -> None:
    assert runs_of(_events(1, 1, 2)) == [1, 1, 2, 2]
    assert runs_of(_events()) == []  # never ran (cancelled while queued)


def test_an_event_of_a_run_taken_over_after_the_next_began_is_two_runs_at_once() -> None:
    assert overlapping([1, 1, 2, 2]) is None
    assert overlapping([1, 2, 1, 2]) == "an event of run 1 after run 2 began"


def test_jobs_lost_duplicated_or_run_twice_at_once_are_violations() -> None:
    records = [
        {"id": f"job_{i}", "tenant": "team-a", "hostile": False, "error": None} for i in range(4)
    ]
    ends = {
        "job_0": {"status": "completed", "final": True, "terminal_events": 1, "runs": [1, 2, 2]},
        "job_1": {"status": "in_progress"},
        "job_2": {"status": "completed", "final": True, "terminal_events": 2, "runs": [1]},
        "job_3": {"status": "completed", "final": True, "terminal_events": 1, "runs": [1, 2, 1]},
    }
    counts, violations = check_jobs(records, ends)
    assert counts["lost"] == 1 and counts["duplicated"] == 1 and counts["ran_twice_at_once"] == 1
    assert counts["taken_over"] == 2 and counts["ended_once"] == 2
    assert len(violations) == 3 and "job_3 ran twice at once" in violations[-1]


def test_batch_lines_missing_repeated_or_foreign_are_violations() -> None:
    records = [{"id": "batch_1", "tenant": "team-a", "custom_ids": ["a", "b", "c"]}]
    ends = {"batch_1": {"status": "completed", "answers": {"a": 1, "b": 2, "z": 1}}}
    counts, violations = check_batches(records, ends)
    assert (counts["answered_once"], counts["lost"], counts["duplicated"]) == (1, 1, 1)
    assert counts["foreign"] == 1 and len(violations) == 3


def test_a_cut_call_is_allowed_only_while_a_gateway_replica_was_killed() -> None:
    def call(t0: float) -> dict[str, Any]:
        return {
            "tenant": "team-a",
            "service_tier": "default",
            "stream": True,
            "t0": t0,
            "t1": t0 + 2,
            "outcome": "cut",
            "status": None,
            "error": "RemoteProtocolError",
        }

    faults = [{"target": "gateway-1", "kind": "kill", "at_s": 11.0}]
    counts, violations = check_chat([call(10.0), call(100.0)], faults)
    assert counts["cut_by_replica_kill"] == 1
    assert len(violations) == 1 and "at 100.0 s" in violations[0]
