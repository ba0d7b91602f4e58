"""The jobs benchmark's report in Markdown (``reports/jobs-bench.md``)."""

from __future__ import annotations

from typing import Any


def num(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def head(title: str, r: dict[str, Any]) -> list[str]:
    """A jobs report's title, command and CPU lines."""
    return [
        f"# {title}",
        "",
        f"Command: `{r['command']}`  ",
        f"CPU: {r['cpu']} ({r['cores']} cores; SeaweedFS, Tansu, the gateway, the stub model "
        "and every worker share them)",
        "",
    ]


def restart_phrase(restart: dict[str, Any] | None, what: str) -> str:
    if not restart:
        return "no broker restart."
    return (
        f"broker restarted at {restart['at_s']} s (back in {restart['took_s']} s, "
        f"{restart['ended_before']} {what} ended before)."
    )


def render(r: dict[str, Any]) -> str:
    p = r["parameters"]
    gap = r["longest_pickup_gap"]
    restart = r["broker_restart"]
    qe, ql = r["queue_wait_s"]["events"], r["queue_wait_s"]["leases"]
    step, first = r["pickup_to_first_step_s"], r["pickup_to_first_command_s"]
    rows = [
        *head("Jobs: throughput and waits while the fleet churns", r),
        f"{p['jobs']} jobs (one command, `{p['job_command']}`, then DONE; verifier "
        "`test -f done`) "
        f"through `POST /v1/jobs`; 1 to {p['max_workers']} `tiergate worker` processes of "
        f"{p['concurrency_per_worker']} slots, one added or removed (SIGTERM, drain "
        f"{p['drain_seconds']:g} s) every {p['churn_seconds']:g} s; "
        + restart_phrase(restart, "jobs")
        + f" Lease {p['lease_seconds']:g} s, session timeout {p['session_timeout_ms']} ms, "
        f"{p['partitions']} partitions.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| jobs ended / submitted | {r['ended']} / {p['jobs']} in {r['seconds']} s |",
        f"| slots, averaged over the run | {r['slots_average']} |",
        f"| throughput | {r['jobs_per_minute']} jobs/min, "
        f"{r['jobs_per_minute_per_slot']} jobs/min per slot |",
        f"| queue wait p50 / p95 (accepted to the first run's lease, ms clock) | "
        f"{num(ql['p50'])} / {num(ql['p95'])} s |",
        f"| queue wait p50 / p95 (job.queued to job.in_progress, 1 s clock) | "
        f"{num(qe['p50'])} / {num(qe['p95'])} s |",
        f"| pickup to first command starting, p50 / p95 (lease to the trajectory's command "
        f"start: reads, sandbox, the model's answer) | {num(first['p50'])} / "
        f"{num(first['p95'])} s |",
        f"| pickup to first step recorded, p50 / p95 (job.in_progress to job.step, 1 s "
        f"clock; the step is written when its command ended) | {num(step['p50'])} / "
        f"{num(step['p95'])} s |",
        f"| longest gap in pickups while jobs waited (job.in_progress times) | "
        f"{gap['seconds']} s"
        + (f" (from {gap['from_s']} s to {gap['to_s']} s)" if gap.get("from_s") is not None else "")
        + " |",
        *fleet_rows(r),
        "",
    ]
    changes = ", ".join(f"{c['at_s']} s: {c['workers']}" for c in r["fleet_changes"])
    rows += [
        f"Fleet changes (seconds after the first submission: workers serving): {changes or 'none'}."
        " Queue waits include the first worker joining its group (a few seconds: nothing is "
        "picked up before that).",
        "",
    ]
    return "\n".join([*rows, *evidence_rows(r)])


def fleet_rows(r: dict[str, Any]) -> list[str]:
    """The table rows every fleet run reports (jobs and batches alike): what was lost,
    failed or run twice, and what the churn did to the workers."""
    return [
        f"| lost (no terminal record by the deadline) | {r['lost']} |",
        f"| failed (not completed with the verifier passed) | {r['failed']} |",
        f"| run twice | {r['run_twice']} |",
        f"| re-run after a worker left (more than one run; expected with drains) | "
        f"{r['rerun_after_worker_left']} |",
        f"| workers started / unhealthy when removed / killed after the drain | "
        f"{r['workers_started']} / {len(r['workers_unhealthy_at_removal'])} / "
        f"{len(r['workers_killed_after_drain'])} |",
    ]


def evidence_rows(r: dict[str, Any]) -> list[str]:
    """The job ids behind every figure that is not zero."""
    evidence = {k: v for k, v in r["evidence"].items() if v}
    if not evidence:
        return []
    return [
        "Evidence (job ids):",
        "",
        "```",
        *(f"{k}: {v}" for k, v in evidence.items()),
        "```",
        "",
    ]
