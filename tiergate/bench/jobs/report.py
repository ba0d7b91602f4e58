"""The jobs benchmark's report in Markdown (``reports/jobs-bench.md``)."""

from __future__ import annotations

from typing import Any


def _s(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def render(r: dict[str, Any]) -> str:
    p = r["parameters"]
    gap = r["longest_pickup_gap"]
    restart = r["broker_restart"]
    qe, ql = r["queue_wait_s"]["events"], r["queue_wait_s"]["leases"]
    step, first = r["pickup_to_first_step_s"], r["pickup_to_first_command_s"]
    rows = [
        "# Jobs: throughput and waits while the fleet churns",
        "",
        f"Command: `{r['command']}`  ",
        f"CPU: {r['cpu']} ({r['cores']} cores; SeaweedFS, Tansu, the gateway, the stub model "
        "and every worker share them)",
        "",
        f"{p['jobs']} jobs (one command, `{p['job_command']}`, then DONE; verifier "
        "`test -f done`) "
        f"through `POST /v1/jobs`; 1 to {p['max_workers']} `tiergate worker` processes of "
        f"{p['concurrency_per_worker']} slots, one added or removed (SIGTERM, drain "
        f"{p['drain_seconds']:g} s) every {p['churn_seconds']:g} s; "
        + (
            f"broker restarted at {restart['at_s']} s (back in {restart['took_s']} s, "
            f"{restart['ended_before']} jobs ended before)."
            if restart
            else "no broker restart."
        )
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
        f"{_s(ql['p50'])} / {_s(ql['p95'])} s |",
        f"| queue wait p50 / p95 (job.queued to job.in_progress, 1 s clock) | "
        f"{_s(qe['p50'])} / {_s(qe['p95'])} s |",
        f"| pickup to first command starting, p50 / p95 (lease to the trajectory's command "
        f"start: reads, sandbox, the model's answer) | {_s(first['p50'])} / "
        f"{_s(first['p95'])} s |",
        f"| pickup to first step recorded, p50 / p95 (job.in_progress to job.step, 1 s "
        f"clock; the step is written when its command ended) | {_s(step['p50'])} / "
        f"{_s(step['p95'])} s |",
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
    evidence = {k: v for k, v in r["evidence"].items() if v}
    if evidence:
        rows += ["Evidence (job ids):", "", "```", *(f"{k}: {v}" for k, v in evidence.items())]
        rows += ["```", ""]
    return "\n".join(rows)


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
