"""``tiergate bench jobs``: agent jobs through the whole pipeline while the worker fleet
grows and shrinks and the broker restarts, with what each job's record says happened.

One run starts a SeaweedFS object store and a Tansu broker on it (tiergate.local.servers),
a stub model (:mod:`tiergate.bench.stub_model`: one shell command, then DONE), a gateway
with jobs enabled in front of it (``tiergate serve``) and one ``tiergate worker``; then it
submits the jobs through ``POST /v1/jobs`` and, every ``churn_seconds``, adds or removes
one worker between 1 and ``max_workers`` (up to the most, down to one, up again, as an
autoscaler following a backlog would; removal is SIGTERM, so the worker drains), and once
half the jobs have ended restarts the broker (same port and data). It waits until every job
has a terminal record or the deadline passes, then reads each job's events, run leases and
trajectory from the store (figures: :mod:`tiergate.bench.jobs_figures`).

Each job's verifier checks the file its command touched (``test -f done``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from tiergate.bench.gateway import cpu_model
from tiergate.bench.jobs_figures import (
    JobTimeline,
    longest_pickup_gap,
    pickup_to_first_command,
    pickup_to_first_step,
    queue_waits_events,
    queue_waits_leases,
    slots_average,
    spread,
    tally,
)
from tiergate.bench.jobs_fleet import CONCURRENCY, DRAIN_SECONDS, WorkerFleet
from tiergate.bench.jobs_report import render
from tiergate.bench.report import write_report
from tiergate.bench.stub_model import MODEL
from tiergate.local.servers import (
    BROKER_BUCKET,
    LOCAL_CREDENTIALS,
    ObjectStore,
    Server,
    broker,
    ensure_bucket,
    object_store,
)
from tiergate.measure.ports import free_port
from tiergate.measure.wait import wait_until
from tiergate.queue.pipeline import JobQueue
from tiergate.queue.store import JobStore
from tiergate.settings import JobsSettings


def _say(message: str) -> None:
    print(f"[bench jobs] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class JobsBenchParams:
    """What one run does."""

    jobs: int = 100
    max_workers: int = 4
    churn_seconds: float = 10.0
    broker_restart: bool = True
    deadline_seconds: float = 600.0
    job_seconds: float = 1.0  # how long each job's command runs (sleep)
    short: bool = False
    assignment: str = "cooperative-sticky"  # jobs.kafka.assignment of the workers

    def command(self) -> str:
        parts = ["tiergate bench jobs"]
        if self.short:
            parts.append("--short")
        else:
            parts += [
                f"--jobs {self.jobs}",
                f"--max-workers {self.max_workers}",
                f"--churn-seconds {self.churn_seconds:g}",
                f"--job-seconds {self.job_seconds:g}",
            ]
        if not self.broker_restart:
            parts.append("--no-broker-restart")
        if self.assignment != "cooperative-sticky":
            parts.append(f"--assignment {self.assignment}")
        return " ".join(parts)


# Churn every 10 s: an autoscaler's cadence is slower still (KEDA polls every 30 s by
# default); faster churn than a rebalance takes on Tansu (see the README) stalls pickups.
SHORT = JobsBenchParams(
    jobs=20, max_workers=2, churn_seconds=10.0, deadline_seconds=300.0, short=True
)


def _child_env(config: Path | None = None) -> dict[str, str]:
    """The environment for the gateway and workers: none of this shell's TIERGATE_*
    settings (they would override the file), the local store's credentials."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERGATE_")}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env.update(LOCAL_CREDENTIALS)
    if config is not None:
        env["TIERGATE_CONFIG"] = str(config)
    return env


def _jobs_tree(
    broker_address: str, s3_url: str, gateway_url: str, work: Path, n: int, assignment: str
) -> Any:
    name = uuid.uuid4().hex[:8]
    return {
        "enabled": True,
        "gateway_url": gateway_url,
        "max_outstanding_jobs": n + 10,
        "kafka": {
            "bootstrap_servers": broker_address,
            "topic": f"bench-jobs-{name}",
            "retry_topic": f"bench-retry-{name}",
            "dead_letter_topic": f"bench-dead-{name}",
            "group": f"bench-workers-{name}",
            "assignment": assignment,
        },
        "storage": {"endpoint_url": s3_url, "bucket": f"bench-jobs-{name}"},
        "sandbox": {"work_dir": str(work / "sandboxes"), "cache_dir": str(work / "cache")},
        "worker": {
            "concurrency": CONCURRENCY,
            "drain_seconds": DRAIN_SECONDS,
            "metrics_host": "127.0.0.1",
        },
    }


def _job_body(seconds: float) -> dict[str, Any]:
    """A job whose one command (the stub model gives the instruction back) runs
    ``seconds`` and touches the file its verifier checks."""
    return {
        "model": MODEL,
        "instruction": f"sleep {seconds:g} && touch done" if seconds > 0 else "touch done",
        "limits": {"max_steps": 3, "timeout_seconds": 120},
        "verifier": {"command": "test -f done"},
    }


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )


def _timeline(store: JobStore, job_id: str, lease_seconds: float) -> JobTimeline:
    job = store.get(job_id)
    final = store.final(job_id)
    leases = store.leases(lease_seconds)
    taken: dict[int, float] = {}
    for epoch in range(1, leases.latest(job_id) + 1):
        body = store.objects.get(leases.run_key(job_id, epoch))
        if body is not None:
            taken[epoch] = float(body.decode().split()[1])
    first: float | None = None
    raw = store.read_artifact(job_id, "trajectory") if final is not None else None
    for line in (raw or b"").decode().splitlines():
        entry = json.loads(line)
        if entry.get("type") == "command":
            first = float(entry["ts"]) - float(entry["seconds"])
            break
    return JobTimeline(
        id=job_id,
        accepted_ms=job.created_at_ms if job is not None else 0,
        events=store.events(job_id, 0),
        status=final.status.value if final is not None else None,
        passed=final.result.passed if final is not None and final.result else None,
        run=final.run if final is not None else None,
        leases=taken,
        first_command_started=first,
    )


class _Run:
    """The servers, gateway and fleet of one benchmark run."""

    def __init__(self, params: JobsBenchParams, work: Path) -> None:
        self.params = params
        self.work = work
        self.s3: ObjectStore = object_store(work / "s3", work / "seaweedfs.log")
        self.broker: Server | None = None
        self.children: list[subprocess.Popen[bytes]] = []
        self.fleet: WorkerFleet | None = None

    def stop(self) -> None:
        if self.fleet is not None:
            _say("stopping the workers")
            self.fleet.close()
        for proc in self.children:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.broker is not None:
            self.broker.stop()
        self.s3.stop()

    def start(self) -> tuple[str, JobsSettings]:
        _say("starting SeaweedFS and Tansu")
        self.s3.start()
        ensure_bucket(self.s3.url, BROKER_BUCKET)
        self.broker = broker(free_port(), self.s3.url, self.work / "tansu.log").start()
        model_port, gateway_port, metrics_port = free_port(), free_port(), free_port()
        env = _child_env()
        self.children.append(
            _spawn(
                [sys.executable, "-m", "tiergate.bench.stub_model", str(model_port)],
                env,
                self.work / "stub-model.log",
            )
        )
        model_url = f"http://127.0.0.1:{model_port}"
        gateway_url = f"http://127.0.0.1:{gateway_port}"
        jobs = _jobs_tree(
            self.broker.address,
            self.s3.url,
            gateway_url,
            self.work,
            self.params.jobs,
            self.params.assignment,
        )
        settings = JobsSettings.model_validate(jobs)
        JobStore(settings.storage).ensure_bucket()
        JobQueue(settings.kafka).ensure_topics()
        config = self.work / "gateway.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "tiers": {
                        "standard": {"endpoints": [model_url]},
                        "fast": {"endpoints": [model_url]},
                    },
                    "gateway": {
                        "port": gateway_port,
                        "metrics_port": metrics_port,
                        "log_requests": False,
                    },
                    "jobs": jobs,
                }
            )
        )
        _say("starting the stub model and the gateway")
        if not wait_until(lambda: _answers(f"{model_url}/health"), 30, 0.2):
            raise RuntimeError(f"the stub model did not start; see {self.work}/stub-model.log")
        self.children.append(
            _spawn(
                [sys.executable, "-m", "tiergate", "serve"],
                _child_env(config),
                self.work / "gateway.log",
            )
        )
        if not wait_until(lambda: _answers(f"{gateway_url}/readyz"), 60, 0.3):
            raise RuntimeError(f"the gateway is not ready; see {self.work}/gateway.log")
        self.fleet = WorkerFleet(jobs, self.work, _child_env())
        return gateway_url, settings


def _drive(run: _Run, gateway_url: str, settings: JobsSettings) -> dict[str, Any]:
    """Submit, churn the fleet, restart the broker once, wait; what happened, by the bench's
    own clock."""
    params, fleet = run.params, run.fleet
    assert fleet is not None and run.broker is not None
    store = JobStore(settings.storage)
    _say("starting the first worker")
    fleet.add()
    t0, t0_wall = time.monotonic(), time.time()
    slots: list[tuple[float, int]] = [(t0, CONCURRENCY)]
    _say(f"submitting {params.jobs} jobs")
    with httpx.Client(base_url=gateway_url, timeout=30) as client:
        ids = []
        for _ in range(params.jobs):
            resp = client.post("/v1/jobs", json=_job_body(params.job_seconds))
            if resp.status_code != 200:
                raise RuntimeError(f"POST /v1/jobs answered {resp.status_code}: {resp.text}")
            ids.append(resp.json()["id"])
    _say(f"submitted in {time.monotonic() - t0:.1f} s")
    deadline = t0 + params.deadline_seconds
    open_ids = set(ids)
    changes: list[dict[str, Any]] = []
    restart: dict[str, Any] = {}
    restarting: threading.Thread | None = None
    direction, next_change, next_check = 1, t0 + params.churn_seconds, 0.0

    def restart_broker() -> None:
        assert run.broker is not None
        began = time.monotonic()
        run.broker.restart()
        restart["took_s"] = round(time.monotonic() - began, 1)
        _say(f"broker back in {restart['took_s']} s")

    while open_ids and time.monotonic() < deadline:
        now = time.monotonic()
        fleet.reap()
        if now >= next_check:
            open_ids = {i for i in open_ids if store.final(i) is None}
            next_check = now + 1.0
            done = params.jobs - len(open_ids)
            if params.broker_restart and restarting is None and done >= params.jobs / 2:
                _say(f"{done}/{params.jobs} ended: restarting the broker")
                restart.update(at_s=round(now - t0, 1), ended_before=done)
                # In a thread, so that the fleet's clock and the polling go on meanwhile.
                restarting = threading.Thread(target=restart_broker, daemon=True)
                restarting.start()
        # A worker starting while the broker is away cannot make its topics: no change
        # until it is back (the change is due at once then).
        broker_away = restarting is not None and restarting.is_alive()
        if open_ids and now >= next_change and not broker_away and params.max_workers > 1:
            serving = len(fleet.serving)
            if not 1 <= serving + direction <= params.max_workers:
                direction = -direction
            pid = fleet.add().proc.pid if direction > 0 else fleet.remove()
            count = len(fleet.serving)
            slots.append((time.monotonic(), count * CONCURRENCY))
            changes.append({"at_s": round(time.monotonic() - t0, 1), "pid": pid, "workers": count})
            _say(
                f"{'added' if direction > 0 else 'removed (SIGTERM)'} worker {pid}: "
                f"{count} serving; {params.jobs - len(open_ids)}/{params.jobs} ended"
            )
            next_change = time.monotonic() + params.churn_seconds
        time.sleep(0.3)
    if restarting is not None:
        restarting.join(90)
    end = time.monotonic()
    if open_ids:
        open_ids = {i for i in open_ids if store.final(i) is None}
    _say(
        f"{params.jobs - len(open_ids)}/{params.jobs} ended after {end - t0:.1f} s"
        + (f"; {len(open_ids)} without a terminal record at the deadline" if open_ids else "")
    )
    return {
        "ids": ids,
        "t0_wall": t0_wall,
        "seconds": end - t0,
        "slots_average": slots_average(slots, end),
        "fleet_changes": changes,
        "broker_restart": restart or None,
    }


def run_jobs_benchmark(out: Path, params: JobsBenchParams) -> tuple[dict[str, Any], bool]:
    """One run; writes ``jobs-bench.{json,md}`` under ``out``; returns the report and
    whether nothing was lost, failed or run twice."""
    work = Path(tempfile.mkdtemp(prefix="tiergate-bench-jobs-", dir="/tmp"))
    work.chmod(0o755)  # the sandbox's unprivileged users reach their workspaces below
    for key, value in LOCAL_CREDENTIALS.items():
        os.environ.setdefault(key, value)
    cpu = cpu_model()
    _say(f"CPU: {cpu}; {params.command()}")
    run = _Run(params, work)
    try:
        gateway_url, settings = run.start()
        drove = _drive(run, gateway_url, settings)
        assert run.fleet is not None
        fleet = run.fleet
        _say("stopping the workers")
        fleet.close()
        run.fleet = None
        store = JobStore(settings.storage)
        _say("reading every job's events, leases and trajectory")
        lease_seconds = settings.worker.lease_seconds
        timelines = [_timeline(store, i, lease_seconds) for i in drove["ids"]]
    finally:
        with contextlib.suppress(Exception):
            run.stop()
        _keep_logs(work)
    counts = tally(timelines)
    ended = sum(1 for t in timelines if t.status is not None)
    minutes = drove["seconds"] / 60
    report: dict[str, Any] = {
        "command": params.command(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "parameters": {
            "jobs": params.jobs,
            "max_workers": params.max_workers,
            "churn_seconds": params.churn_seconds,
            "broker_restart": params.broker_restart,
            "deadline_seconds": params.deadline_seconds,
            "job_command": _job_body(params.job_seconds)["instruction"],
            "concurrency_per_worker": CONCURRENCY,
            "drain_seconds": DRAIN_SECONDS,
            "lease_seconds": lease_seconds,
            "session_timeout_ms": settings.kafka.session_timeout_ms,
            "partitions": settings.kafka.partitions,
        },
        "seconds": round(drove["seconds"], 1),
        "ended": ended,
        "slots_average": round(drove["slots_average"], 2),
        "jobs_per_minute": round(ended / minutes, 2),
        "jobs_per_minute_per_slot": round(ended / minutes / drove["slots_average"], 2),
        "queue_wait_s": {
            "events": spread(queue_waits_events(timelines)),
            "leases": spread(queue_waits_leases(timelines)),
        },
        "pickup_to_first_step_s": spread(pickup_to_first_step(timelines)),
        "pickup_to_first_command_s": spread(pickup_to_first_command(timelines)),
        "longest_pickup_gap": _relative(longest_pickup_gap(timelines), drove["t0_wall"]),
        **{k: v for k, v in counts.items() if k != "evidence"},
        "evidence": counts["evidence"],
        "fleet_changes": drove["fleet_changes"],
        "workers_started": fleet.started,
        "workers_unhealthy_at_removal": fleet.unhealthy_at_removal,
        "workers_killed_after_drain": fleet.killed_after_drain,
        "worker_exit_codes": sorted(set(fleet.exit_codes.values())),
        "broker_restart": drove["broker_restart"],
        # Every pickup, seconds after the first submission: where the gaps are.
        "pickups": sorted(
            [round(e["created_at"] - drove["t0_wall"], 1), t.id, e.get("run")]
            for t in timelines
            for e in t.of("job.in_progress")
        ),
    }
    clean = counts["lost"] == counts["failed"] == counts["run_twice"] == 0
    if not clean:
        for t in timelines:
            if t.id in counts["evidence"]["run_twice"] or t.id in counts["evidence"]["lost"]:
                report.setdefault("events_of_suspect_jobs", {})[t.id] = {
                    "events": [
                        {k: e.get(k) for k in ("type", "created_at", "run", "attempt", "step")}
                        for e in t.events
                    ],
                    "leases": t.leases,
                }
    write_report(out, "jobs-bench", report, render(report))
    return report, clean


def _relative(gap: dict[str, Any], t0_wall: float) -> dict[str, Any]:
    """The gap with its ends also in seconds after the first job's submission (the clock
    the fleet changes and the broker restart are given in)."""
    for end in ("from", "to"):
        at = gap[end]
        gap[f"{end}_s"] = None if at is None else round(at - t0_wall, 1)
    return gap


def _keep_logs(work: Path) -> None:
    """Delete the run's data (object store, sandboxes, cache); keep its logs and settings
    files (workers.log, gateway.log, tansu.log, seaweedfs.log) for a look afterwards."""
    for data in ("s3", "sandboxes", "cache"):
        shutil.rmtree(work / data, ignore_errors=True)
    _say(f"logs kept in {work}")
