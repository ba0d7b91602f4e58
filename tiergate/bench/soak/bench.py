"""``tiergate bench soak``: the stack as the chart arranges it (:mod:`.stack`), every
surface driven at once (:mod:`.load`), faults on a seeded schedule (:mod:`.faults`), every
process's memory and open files sampled, and the history checked at the end
(:mod:`.check`); the report and its figure (:mod:`.report`).

The engines are the stand-in model (``tiergate.bench.stub_model``): an hour at these rates
on two cores would otherwise measure the engines, not the system around them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tiergate.bench.gateway import cpu_model
from tiergate.bench.jobs.stack import keep_logs, new_work_dir
from tiergate.bench.report import write_report
from tiergate.bench.soak import check, faults, load
from tiergate.bench.soak.report import render
from tiergate.bench.soak.stack import TENANTS, RealEngines, SoakStack
from tiergate.jobs.state.store import JobStore
from tiergate.jobsclient.errors import JobsError
from tiergate.jobsclient.sync import JobsClient

TERMINAL_JOB = {"completed", "failed", "cancelled", "incomplete", "expired"}
TERMINAL_BATCH = {"completed", "failed", "expired", "cancelled"}
LATE_FAULTS_SECONDS = 600.0


def say(message: str) -> None:
    print(f"[bench soak] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class SoakParams:
    minutes: float = 60.0
    warmup_minutes: float = 10.0
    fault_rounds: int = 2  # every kind of fault this many times
    seed: int = 1
    sample_seconds: float = 10.0
    drain_seconds: float = 300.0  # after the load: for the accepted work to end
    rates: load.Rates = field(default_factory=load.Rates)
    kinds: tuple[tuple[str, str], ...] = faults.KINDS
    engine: str = "stand-in"  # or "vllm": each tier's engine as `make up` runs it

    def command(self) -> str:
        return (
            f"tiergate bench soak --minutes {self.minutes:g} --warmup {self.warmup_minutes:g} "
            f"--fault-rounds {self.fault_rounds} --seed {self.seed} --engine {self.engine}"
        )


# With vLLM on two cores: rates the engines carry with room for a restart's backlog (an
# engine killed takes its compiled start again, about a minute).
VLLM_RATES = load.Rates(
    chat_per_s=1.0, jobs_per_s=0.05, batches_per_s=1 / 120, batch_lines=10, streams_per_s=1 / 60
)


# The suite's form: three and a half minutes, the kinds of fault the chart's pods meet
# most, a full workspace volume and a slow store among them.
SHORT = SoakParams(
    minutes=3.5,
    warmup_minutes=0.5,
    fault_rounds=1,
    sample_seconds=5.0,
    drain_seconds=180.0,
    kinds=(
        ("kill", "worker-1"),
        ("kill", "gateway-1"),
        ("kill", "engine-fast"),
        ("stop", "worker-2"),
        ("kill", "broker"),
        ("kill", "redis"),
        ("fill", "worker-1"),
        ("slow", "store-network"),
    ),
)


def _usage(pid: int, session: bool) -> tuple[float, int]:
    """Resident MB and open files of process ``pid``, or (``session``) of every process in
    its session (it leads one: what it started is counted with it)."""
    if not session:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            files = len(os.listdir(f"/proc/{pid}/fd"))
        except (OSError, IndexError):
            return 0.0, 0
        return int(fields[21]) * os.sysconf("SC_PAGE_SIZE") / 1048576, files
    return _session_usage(pid)


def _session_usage(sid: int) -> tuple[float, int]:
    """Resident MB and open files of every process in session ``sid``."""
    rss_kb = 0
    files = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[3]) != sid:  # field 6 of stat: the session id
                continue
            rss_kb += int(fields[21]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
            files += len(os.listdir(f"/proc/{entry}/fd"))
        except (OSError, ValueError, IndexError):
            continue
    return rss_kb / 1024, files


def _metric_sum(url: str, name: str) -> float | None:
    try:
        text = httpx.get(url, timeout=2).text
    except httpx.HTTPError:
        return None
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and (line[len(name)] in " {")
    ]
    return sum(values) if values else None


class Sampler:
    """Every ``every`` seconds: each process's RSS and open files (with what it started,
    an engine's core processes among them; a worker alone, without its jobs' sandboxes);
    the patient lane's limit (gateway-1's metrics) and the queue lag (the workers')."""

    def __init__(self, stack: SoakStack, started: float, every: float) -> None:
        self.stack, self.started, self.every = stack, started, every
        self.processes: dict[str, list[list[float]]] = {}
        self.lane: list[list[float]] = []
        self.lag: list[list[float]] = []

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.every):
            t = round(time.time() - self.started, 1)
            for name in self.stack.servers:
                pid = self.stack.pid(name)
                if pid is not None:
                    # A worker's session holds its running jobs' sandboxes: the worker
                    # alone is what could leak (the jobs come and go).
                    rss, files = _usage(pid, session=not name.startswith("worker"))
                    self.processes.setdefault(name, []).append([t, round(rss, 1), files])
            lane = _metric_sum(self.stack.metrics_url("gateway-1"), "tiergate_patient_lane_limit")
            if lane is not None:
                self.lane.append([t, lane])
            lags = [
                _metric_sum(self.stack.metrics_url(w), "tiergate_jobs_queue_lag")
                for w in ("worker-1", "worker-2")
            ]
            if any(v is not None for v in lags):
                self.lag.append([t, max(v for v in lags if v is not None)])


def growth(
    series: list[list[float]], warmup_s: float, downs: list[tuple[float, float]]
) -> dict[str, Any]:
    """RSS growth over the longest stretch after the warm-up in which the process was
    neither down nor just restarted (``downs``: each kill's (at, back); a restarted
    process's first 30 s left out, it warms up too), in percent of the stretch's first
    sample per hour (a least-squares line through its samples)."""
    bounds = [(warmup_s, float("inf"))]
    for at, back in sorted(downs):
        lo, _ = bounds[-1]
        if back + 30 <= lo:
            continue
        bounds[-1] = (lo, at)
        bounds.append((max(lo, back + 30), float("inf")))
    stretches = [[s for s in series if lo <= s[0] < hi] for lo, hi in bounds]
    after = max(stretches, key=lambda st: st[-1][0] - st[0][0] if st else -1.0)
    end = series[-1][1] if series else None
    if len(after) < 3 or after[-1][0] - after[0][0] < 300:
        return {"rss_mb_after_warmup": None, "rss_mb_end": end, "pct_per_hour": None}
    fit = statistics.linear_regression([s[0] for s in after], [s[1] for s in after])
    first = after[0][1]
    return {
        "rss_mb_after_warmup": first,
        "rss_mb_end": after[-1][1],
        "pct_per_hour": round(100 * fit.slope * 3600 / first, 1) if first else None,
        "window_s": [after[0][0], after[-1][0]],
    }


def latency_per_minute(chats: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    keys = sorted({(int(r["t0"] // 60), r["tier"]) for r in chats})
    for minute, tier in keys:
        mine = [r for r in chats if int(r["t0"] // 60) == minute and r["tier"] == tier]
        ms = sorted(1000 * (r["t1"] - r["t0"]) for r in mine if r["outcome"] == "answered")
        rows.append(
            {
                "minute": minute,
                "tier": tier,
                "count": len(mine),
                "p50_ms": round(statistics.median(ms), 1) if ms else None,
                "p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 1) if ms else None,
                "refused": sum(1 for r in mine if r["outcome"] == "refused"),
                "failed": sum(1 for r in mine if r["outcome"] in ("cut", "untyped", "hung")),
            }
        )
    return rows


def _read_jobs(
    client: httpx.Client, stack: SoakStack, records: list[dict[str, Any]], deadline: float
) -> dict[str, dict[str, Any]]:
    assert stack.settings is not None
    store = JobStore(stack.settings.storage)
    ends: dict[str, dict[str, Any]] = {}
    pending = [r for r in records if r["id"]]
    while pending and time.time() < deadline:
        left = []
        for r in pending:
            key = stack.keys.secrets[r["tenant"]]
            try:
                resp = client.get(f"/v1/jobs/{r['id']}", headers={"authorization": f"Bearer {key}"})
                status = resp.json().get("status") if resp.status_code == 200 else None
            except (httpx.HTTPError, ValueError):
                status = None
            if status in TERMINAL_JOB:
                events = store.events(r["id"], 0)
                ends[r["id"]] = {
                    "status": status,
                    "final": store.final(r["id"]) is not None,
                    "terminal_events": sum(
                        1 for e in events if e["type"].removeprefix("job.") in TERMINAL_JOB
                    ),
                    "runs": check.runs_of(events),
                }
            else:
                ends[r["id"]] = {"status": status}
                left.append(r)
        pending = left
        if pending:
            say(f"waiting for {len(pending)} job(s) to end")
            time.sleep(5)
    return ends


def _read_batches(
    client: httpx.Client, stack: SoakStack, records: list[dict[str, Any]], deadline: float
) -> dict[str, dict[str, Any]]:
    ends: dict[str, dict[str, Any]] = {}
    pending = [r for r in records if r["id"]]
    while pending and time.time() < deadline:
        left = []
        for r in pending:
            headers = {"authorization": f"Bearer {stack.keys.secrets[r['tenant']]}"}
            try:
                batch = client.get(f"/v1/batches/{r['id']}", headers=headers).json()
            except (httpx.HTTPError, ValueError):
                left.append(r)
                continue
            if batch.get("status") not in TERMINAL_BATCH:
                ends[r["id"]] = {"status": batch.get("status")}
                left.append(r)
                continue
            answers: dict[str, int] = {}
            for fid in (batch.get("output_file_id"), batch.get("error_file_id")):
                if not fid:
                    continue
                body = client.get(f"/v1/files/{fid}/content", headers=headers).text
                for line in body.splitlines():
                    if line.strip():
                        cid = str(json.loads(line).get("custom_id"))
                        answers[cid] = answers.get(cid, 0) + 1
            ends[r["id"]] = {"status": batch["status"], "answers": answers}
        pending = left
        if pending:
            say(f"waiting for {len(pending)} batch(es) to end")
            time.sleep(5)
    return ends


def _read_rollouts(
    stack: SoakStack, history: load.History, deadline: float
) -> dict[str, dict[str, Any]]:
    """Each rollout batch's end, once its trainer's group reader has returned (it returns
    when the batch ends)."""
    while time.time() < deadline:
        started = {r["n"] for r in history.of("rollouts_started")}
        if len(history.of("rollouts")) >= len(started):
            break
        say("waiting for the rollout batches' group readers")
        time.sleep(5)
    ends: dict[str, dict[str, Any]] = {}
    for rec in history.of("rollouts"):
        if not rec.get("id"):
            continue
        with JobsClient(base_url=stack.url, api_key=stack.keys.secrets[rec["tenant"]]) as client:
            try:
                batch = client.get_batch(rec["id"])
            except JobsError as exc:
                ends[rec["id"]] = {"status": None, "error": str(exc)}
                continue
        ends[rec["id"]] = {
            "status": batch.status,
            "rollouts": len(batch.rollouts),
            "ended": sum(1 for x in batch.rollouts if x.status in _ROLLOUT_ENDED),
            "task_rounds": sorted({(x.task_id, x.round) for x in batch.rollouts}),
        }
    return ends


_ROLLOUT_ENDED = {"completed", "incomplete", "failed", "cancelled"}


def run_soak(out: Path, params: SoakParams) -> dict[str, Any]:
    work = new_work_dir()
    cpu = cpu_model()
    say(f"CPU: {cpu}; {params.command()}")
    engines = None
    if params.engine == "vllm":
        from tiergate.settings import load_settings

        engines = RealEngines.from_settings(load_settings())
    stack = SoakStack(work, engines=engines)
    history = load.History()
    fault_log: list[dict[str, Any]] = []
    duration = params.minutes * 60
    warmup = params.warmup_minutes * 60
    plan = faults.schedule(params.seed, warmup, duration - 30, params.fault_rounds, params.kinds)
    for f in plan:
        say(f"planned: {f.at_s:.0f} s {f.kind} {f.target} ({f.hold_s:.0f} s)")
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        say(
            "starting the stack: store, broker, Redis, two engines, two gateways, nginx, "
            "two workers"
        )
        stack.start()
        history.start = time.time()
        sampler = Sampler(stack, history.start, params.sample_seconds)
        client = httpx.Client(
            base_url=stack.url, timeout=60, limits=httpx.Limits(max_connections=200)
        )
        r = params.rates
        if engines is not None:
            r = dataclasses.replace(r, model=engines.model)
        tenants = list(TENANTS)

        def chat(n: int) -> None:
            t = tenants[n % 2]
            load.chat_once(client, history, t, stack.keys.secrets[t], n, r)

        def job(n: int) -> None:
            t = tenants[n % 2]
            load.submit_job(client, history, t, stack.keys.secrets[t], n, r)

        def batch(n: int) -> None:
            t = tenants[n % 2]
            load.submit_batch(client, history, t, stack.keys.secrets[t], n, r)

        def stream(n: int) -> None:
            jobs: list[dict[str, Any]] = []
            while not jobs and not stop.wait(1.0):  # the latest ordinary job, once there is one
                jobs = [j for j in history.of("job") if j["id"] and not j["hostile"]]
            if jobs:
                j = jobs[-1]
                deadline = time.time() + 240
                load.follow_events(
                    client, history, j["tenant"], stack.keys.secrets[j["tenant"]], j["id"], deadline
                )

        def rollouts(n: int) -> None:
            t = tenants[n % 2]
            load.rollout_batch(stack.url, history, t, stack.keys.secrets[t], n, r)

        def failed(what: str) -> Callable[[int, BaseException], None]:
            def record(n: int, exc: BaseException) -> None:
                say(f"the driver's {what} #{n} failed: {exc!r}")
                history.add(kind="driver", what=what, n=n, error=repr(exc))

            return record

        runners = [
            lambda: sampler.run(stop),
            lambda: faults.inject(stack, plan, history.start, stop, fault_log.append, say),
            lambda: load.paced(r.chat_per_s, stop, chat, failed("chat")),
            lambda: load.paced(r.jobs_per_s, stop, job, failed("job")),
            lambda: load.paced(r.batches_per_s, stop, batch, failed("batch")),
            lambda: load.paced(r.streams_per_s, stop, stream, failed("event stream")),
            lambda: load.paced(r.rollout_batches_per_s, stop, rollouts, failed("rollout batch")),
        ]
        threads = [threading.Thread(target=fn, daemon=True) for fn in runners]
        for th in threads:
            th.start()
        # The load runs its duration, and on (up to LATE_FAULTS_SECONDS) until every
        # planned fault has run: a slow restart (a vLLM engine's: minutes) delays those
        # after it, and a fault dropped would leave its kind untested.
        faulting = threads[1]
        while (elapsed := time.time() - history.start) < duration or (
            faulting.is_alive() and elapsed < duration + LATE_FAULTS_SECONDS
        ):
            time.sleep(min(30.0, max(1.0, duration - elapsed + 0.1)))
            chats = history.of("chat")
            say(
                f"{(time.time() - history.start) / 60:.1f} min: {len(chats)} chat calls, "
                f"{len(history.of('job'))} jobs, {len(history.of('batch'))} batches, "
                f"{len(fault_log)} faults"
            )
        loaded = time.time() - history.start
        say(f"load stopped after {loaded / 60:.1f} minutes; the accepted work drains")
        stop.set()
        for th in threads[1:2]:
            th.join(120)
        deadline = time.time() + params.drain_seconds
        job_ends = _read_jobs(client, stack, history.of("job"), deadline)
        batch_ends = _read_batches(client, stack, history.of("batch"), deadline)
        rollout_ends = _read_rollouts(stack, history, deadline)
        client.close()
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            stack.stop()
        keep_logs(work)
    checks: dict[str, dict[str, int]] = {}
    violations: list[str] = []
    for name, (counts, found) in {
        "interactive": check.check_chat(history.of("chat"), fault_log),
        "jobs": check.check_jobs(history.of("job"), job_ends),
        "batch_lines": check.check_batches(history.of("batch"), batch_ends),
        "event_streams": check.check_streams(history.of("events")),
        "rollout_batches": check.check_rollouts(history.of("rollouts"), rollout_ends),
    }.items():
        checks[name] = counts
        violations += found
    # The driver itself: a call of it that failed left its record unwritten.
    for d in history.of("driver"):
        violations.append(f"the load's {d['what']} #{d['n']} failed in the driver: {d['error']}")
    # The run itself: every planned fault injected, and its target back.
    for done in fault_log:
        if done["detail"].startswith(("not injected", "restart failed")):
            violations.append(
                f"fault {done['kind']} {done['target']} at {done['at_s']} s: {done['detail']}"
            )
    if len(fault_log) < len(plan):
        violations.append(f"{len(plan) - len(fault_log)} planned fault(s) never ran")
    downs = {
        name: [
            (f["at_s"], f["back_at_s"])
            for f in fault_log
            if f["target"] == name and f["kind"] == "kill"
        ]
        for name in sampler.processes
    }
    report = {
        "command": params.command(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "seed": params.seed,
        "duration_s": duration,
        "loaded_s": round(loaded, 1),
        "warmup_s": warmup,
        "engine": params.engine,
        "stack": {"gateways": 2, "workers": 2},
        "rates": r.named(),
        "faults": fault_log,
        "latency": latency_per_minute(history.of("chat")),
        "processes": sampler.processes,
        "growth": {n: growth(s, warmup, downs[n]) for n, s in sampler.processes.items()},
        "lane": sampler.lane,
        "queue_lag": sampler.lag,
        "checks": checks,
        "violations": violations,
        "passed": not violations,
        "parameters": {**asdict(params), "work": str(work)},
    }
    # The whole history, for a look at any violation: every call with what it was told.
    out.mkdir(parents=True, exist_ok=True)
    with gzip.open(out / "soak-history.jsonl.gz", "wt") as history_file:
        for record in [
            *history.records,
            *({**f, "fault": f["kind"], "kind": "fault"} for f in fault_log),
        ]:
            history_file.write(json.dumps(record) + "\n")
    report["history_file"] = "soak-history.jsonl.gz"
    write_report(out, "soak-bench", report, render(report))
    return report
