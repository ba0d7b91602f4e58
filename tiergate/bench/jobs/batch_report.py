"""The batch mode's report in Markdown (``reports/jobs-batch-bench.md``)."""

from __future__ import annotations

from typing import Any

from tiergate.bench.jobs.report import evidence_rows, fleet_rows, head, num, restart_phrase


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def render(r: dict[str, Any]) -> str:
    p = r["parameters"]
    restart = r["broker_restart"]
    contention = r["contention"]
    domains = ", ".join(
        f"`{d}` ({e['tasks']} tasks of `{e['command']}`, weight {e['weight']:g})"
        for d, e in p["domains"].items()
    )
    rows = [
        *head("Jobs: a rollout batch while the fleet churns", r),
        f"One batch through `POST /v1/jobs/batches`: {domains}; {p['samples_per_task']} "
        f"samples of each task, `max_in_flight` {p['max_in_flight']} (the slots of "
        f"{p['max_workers']} workers), scheduled every {p['batch_poll_seconds']:g} s. 1 to "
        f"{p['max_workers']} `tiergate worker` processes of {p['concurrency_per_worker']} "
        f"slots, one added or removed (SIGTERM, drain {p['drain_seconds']:g} s) every "
        f"{p['churn_seconds']:g} s; " + restart_phrase(restart, "rollouts"),
        "",
        "| figure | value |",
        "|---|---|",
        f"| rollouts ended / planned | {r['ended']} / {r['rollouts']} (batch "
        f"{r['batch']['status']}) |",
        f"| time to the last rollout (submission to its end) | "
        f"{num(r['time_to_last_rollout_s'], 1)} s |",
        f"| slots, averaged to the last rollout | {r['slots_average']} |",
        f"| throughput | {num(r['rollouts_per_minute'])} rollouts/min, "
        f"{num(r['rollouts_per_minute_per_slot'])} rollouts/min per slot |",
        *fleet_rows(r),
        "",
        f"While every domain had samples left to start (the submission to "
        f"{contention['until_s']} s), rollouts held {contention['held_slot_seconds']} of "
        f"the fleet's {contention['fleet_slot_seconds']} slot-seconds (at most "
        f"{contention['peak_running']} running at once), and the domains had them as "
        "follows (a rollout holds a slot from its run's lease to its end):",
        "",
        "| domain | rollouts by status | run p50 / max | slot-seconds | share | weight's "
        "share | most running at once |",
        "|---|---|---|---|---|---|---|",
    ]
    for domain, entry in contention["domains"].items():
        figures = r["domains"].get(domain, {"counts": {}, "run_s": {}})
        counts = ", ".join(f"{k} {v}" for k, v in sorted(figures["counts"].items()))
        run = figures["run_s"]
        rows.append(
            f"| `{domain}` | {counts} | {num(run.get('p50'))} / {num(run.get('max'))} s | "
            f"{entry['slot_seconds']} | {_pct(entry['share'])} | "
            f"{_pct(entry['weight_share'])} | {entry['peak_running']} |"
        )
    changes = ", ".join(f"{c['at_s']} s: {c['workers']}" for c in r["fleet_changes"])
    gap = r["longest_start_gap"]
    runs = ", ".join(f"{s['at_s']} s: {s['holder']}" for s in r["scheduler_runs"])
    rows += [
        "",
        f"Fleet changes (seconds after the submission: workers serving): {changes or 'none'}.",
        f"The batch's scheduler lease was taken at (seconds: holder): {runs or 'never'}. "
        f"Longest stretch without a sample started: {gap['seconds']} s"
        + (f" ({gap['from']} s to {gap['to']} s)." if gap["from"] is not None else "."),
        "",
    ]
    return "\n".join([*rows, *evidence_rows(r)])
