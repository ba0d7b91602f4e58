"""The soak's history check: what each call was told, against what the system promises
(``docs/reliability.md``). Pure functions over the driver's records and what was read
back at the end; each returns its counts and its violations (sentences)."""

from __future__ import annotations

from collections import Counter
from typing import Any

Checked = tuple[dict[str, int], list[str]]


def _during(faults: list[dict[str, Any]], targets: tuple[str, ...], t0: float, t1: float) -> bool:
    return any(
        f["target"].startswith(targets) and f["kind"] == "kill" and t0 - 1 <= f["at_s"] <= t1 + 1
        for f in faults
    )


def check_chat(records: list[dict[str, Any]], faults: list[dict[str, Any]]) -> Checked:
    """Every interactive call answered, or refused with a typed error, inside its timeout.
    A connection cut (or the Service's 502 without an envelope) is allowed only when a
    gateway replica was killed during the call (the replica carrying it: nothing can
    answer for a process that is gone)."""
    counts = Counter(r["outcome"] for r in records)
    violations = []
    cut_by_kill = 0
    for r in records:
        how = "stream" if r["stream"] else "call"
        span = f"{r['tenant']} {r['service_tier']} {how} at {r['t0']:.1f} s"
        if r["outcome"] == "hung":
            violations.append(f"chat hung past its timeout: {span}")
        elif r["outcome"] == "untyped":
            if r["status"] == 502 and _during(faults, ("gateway",), r["t0"], r["t1"]):
                # The Service's own answer (nginx) for a replica killed holding the call;
                # through an L4 Service the client sees the connection cut.
                cut_by_kill += 1
            else:
                violations.append(f"chat refused without an error envelope ({r['status']}): {span}")
        elif r["outcome"] == "cut":
            if _during(faults, ("gateway",), r["t0"], r["t1"]):
                cut_by_kill += 1
            else:
                violations.append(f"chat cut ({r['error']}) with no replica killed: {span}")
        if r.get("foreign"):
            violations.append(f"chat answer held another tenant's marker: {span}: {r['foreign']!r}")
    return {
        "sent": len(records),
        "answered": counts["answered"],
        "refused_typed": counts["refused"],
        "cut_by_replica_kill": cut_by_kill,
        "responses_api_answered": sum(
            1 for r in records if r.get("api") == "responses" and r["outcome"] == "answered"
        ),
        "streams_answered": sum(1 for r in records if r["stream"] and r["outcome"] == "answered"),
        "untyped": counts["untyped"],
        "hung": counts["hung"],
    }, violations


def runs_of(events: list[dict[str, Any]]) -> list[int]:
    """The run (lease epoch) behind each of a job's events that names one, in sequence
    order: ``run`` of ``job.in_progress``, ``job.step``, ``job.verified``,
    ``job.retrying``, and the terminal event's ``job.run``."""
    runs = []
    for event in events:
        run = event.get("run")
        if run is None and isinstance(event.get("job"), dict):
            run = event["job"].get("run")
        if isinstance(run, int):
            runs.append(run)
    return runs


def overlapping(runs: list[int]) -> str | None:
    """Two runs of one job at once, as its events show it: an event of an earlier run
    after a later run began (a run taken over must write nothing more)."""
    latest = 0
    for run in runs:
        if run < latest:
            return f"an event of run {run} after run {latest} began"
        latest = max(latest, run)
    return None


def check_jobs(records: list[dict[str, Any]], ends: dict[str, dict[str, Any]]) -> Checked:
    """``ends[id]``: what was read back of an accepted job: ``status`` (its last status),
    ``terminal_events`` (how many), ``final`` (a terminal record exists), ``owner_ok``,
    ``runs`` (:func:`runs_of` its events). Every accepted job ended, once, never run twice
    at once; every refusal typed."""
    accepted = [r for r in records if r["id"]]
    violations = []
    lost = dup = overlaps = 0
    for r in accepted:
        end = ends.get(r["id"], {})
        overlap = overlapping(end.get("runs", []))
        if overlap:
            overlaps += 1
            violations.append(f"job {r['id']} ran twice at once: {overlap}")
        if not end.get("final") or end.get("terminal_events", 0) == 0:
            lost += 1
            violations.append(f"job {r['id']} ({r['tenant']}) never ended: {end.get('status')}")
        elif end["terminal_events"] > 1:
            dup += 1
            violations.append(f"job {r['id']} has {end['terminal_events']} terminal events")
        if end and not end.get("owner_ok", True):
            violations.append(f"job {r['id']} read back under another owner")
    taken_over = sum(1 for r in accepted if len(set(ends.get(r["id"], {}).get("runs", []))) > 1)
    refused = [r for r in records if not r["id"]]
    for r in refused:
        if not r["error"]:
            violations.append(f"job submission of {r['tenant']} refused untyped ({r['status']})")
    hostile = Counter(
        end.get("status") for r in accepted if r["hostile"] for end in [ends.get(r["id"], {})]
    )
    return {
        "accepted": len(accepted),
        "ended_once": len(accepted) - lost - dup,
        "lost": lost,
        "duplicated": dup,
        "ran_twice_at_once": overlaps,
        "taken_over": taken_over,
        "refused_typed": sum(1 for r in refused if r["error"]),
        "hostile_accepted": sum(1 for r in accepted if r["hostile"]),
        "hostile_ended": sum(hostile.values()) - hostile[None],
    }, violations


def check_batches(records: list[dict[str, Any]], ends: dict[str, dict[str, Any]]) -> Checked:
    """``ends[id]``: ``status`` and ``answers`` (each custom_id read in the output and
    error files, as often as it appears). Every line of a batch that ended answered
    exactly once, in its owner's files only; every batch ended."""
    violations = []
    lines = once = lost = dup = foreign = 0
    created = [r for r in records if r["id"]]
    for r in created:
        end = ends.get(r["id"], {})
        if end.get("status") not in ("completed", "failed", "expired", "cancelled"):
            violations.append(f"batch {r['id']} ({r['tenant']}) did not end: {end.get('status')}")
            continue
        answers: Counter[str] = Counter(end.get("answers", {}))
        mine = set(r["custom_ids"])
        lines += len(mine)
        for cid in mine:
            if answers[cid] == 1:
                once += 1
            elif answers[cid] == 0:
                lost += 1
                if end["status"] == "completed":
                    violations.append(f"batch {r['id']}: line {cid} never answered")
            else:
                dup += 1
                violations.append(f"batch {r['id']}: line {cid} answered {answers[cid]} times")
        extra = set(answers) - mine
        if extra:
            foreign += len(extra)
            violations.append(f"batch {r['id']}: {len(extra)} answers of lines not its own")
    for r in records:
        if not r["id"] and not r["error"]:
            violations.append(
                f"batch of {r['tenant']} refused untyped at {r['stage']} ({r['status']})"
            )
    return {
        "created": len(created),
        "lines": lines,
        "answered_once": once,
        "lost": lost,
        "duplicated": dup,
        "foreign": foreign,
        "refused_typed": sum(1 for r in records if not r["id"] and r["error"]),
    }, violations


def check_streams(records: list[dict[str, Any]]) -> Checked:
    """Every event stream, resumed after each drop, gave each sequence number once, in
    order, without a gap, up to the job's terminal event."""
    violations = []
    gaps = 0
    for r in records:
        seen = r["seen"]
        if seen != list(range(1, len(seen) + 1)):
            gaps += 1
            violations.append(f"events of {r['id']}: a gap, a repeat or out of order {seen[:20]}")
        if not r["done"]:
            violations.append(f"events of {r['id']}: no terminal event ({r['error']})")
    return {
        "streams": len(records),
        "resumed": sum(r["reconnects"] for r in records),
        "without_gap": len(records) - gaps,
        "ended": sum(1 for r in records if r["done"]),
    }, violations


def check_rollouts(records: list[dict[str, Any]], ends: dict[str, dict[str, Any]]) -> Checked:
    """``ends[id]``: the batch read back (``status``, ``rollouts``, ``ended``,
    ``task_rounds``). Every rollout batch ended with every rollout ended; its trainer took
    each group once, in ``seq`` order without a gap, and one group per (task, round) at
    most."""
    violations = []
    groups = 0
    for r in records:
        if not r.get("id"):
            violations.append(f"rollout batch of {r['tenant']} not created: {r.get('error')}")
            continue
        end = ends.get(r["id"], {})
        if end.get("status") not in ("completed", "failed", "cancelled", "expired"):
            violations.append(f"rollout batch {r['id']} did not end: {end.get('status')}")
        elif end.get("ended") != end.get("rollouts"):
            violations.append(
                f"rollout batch {r['id']}: "
                f"{end.get('ended')} of {end.get('rollouts')} rollouts ended"
            )
        if r.get("error"):
            violations.append(f"rollout batch {r['id']}: the trainer's reader failed: {r['error']}")
        seqs = [g[0] for g in r["groups"]]
        pairs = [(g[1], g[2]) for g in r["groups"]]
        groups += len(seqs)
        if seqs != list(range(1, len(seqs) + 1)):
            violations.append(
                f"rollout batch {r['id']}: groups out of order, repeated or with a gap {seqs[:20]}"
            )
        if len(set(pairs)) != len(pairs):
            violations.append(f"rollout batch {r['id']}: a (task, round) group taken twice")
    return {
        "batches": len(records),
        "ended": sum(
            1
            for e in ends.values()
            if e.get("status") in ("completed", "failed", "cancelled", "expired")
        ),
        "groups_taken": groups,
    }, violations
