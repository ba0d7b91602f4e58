"""What both modes of ``tiergate bench jobs`` run on: SeaweedFS, a Tansu broker on it, the
stub model (:mod:`tiergate.bench.stub_model`), a gateway with jobs enabled in front of it
(``tiergate serve``) and the worker fleet (:mod:`tiergate.bench.jobs.fleet`); and each
job's record read back from the store afterwards (:func:`timeline`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import httpx
import yaml

from tiergate.bench.jobs.figures import JobTimeline
from tiergate.bench.jobs.fleet import CONCURRENCY, DRAIN_SECONDS, WorkerFleet
from tiergate.bench.stub_model import MODEL
from tiergate.jobs.state.store import JobStore
from tiergate.jobsettings import JobsSettings
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


def say(message: str) -> None:
    print(f"[bench jobs] {message}", file=sys.stderr, flush=True)


def child_env(config: Path | None = None) -> dict[str, str]:
    """The environment for the gateway and workers: none of this shell's TIERGATE_*
    settings (they would override the file), the local store's credentials."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERGATE_")}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env.update(LOCAL_CREDENTIALS)
    if config is not None:
        env["TIERGATE_CONFIG"] = str(config)
    return env


def jobs_tree(
    broker_address: str,
    s3_url: str,
    gateway_url: str,
    work: Path,
    outstanding: int,
    assignment: str,
    batch_poll_seconds: float,
) -> Any:
    name = uuid.uuid4().hex[:8]
    return {
        "enabled": True,
        "gateway_url": gateway_url,
        "max_outstanding_jobs": outstanding + 10,
        "batch_poll_seconds": batch_poll_seconds,
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


def job_body(seconds: float) -> dict[str, Any]:
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


def timeline(store: JobStore, job_id: str, lease_seconds: float) -> JobTimeline:
    """What the store recorded of one job: its events, each run's lease, its terminal
    record and its trajectory's first command and last entry."""
    job = store.get(job_id)
    final = store.final(job_id)
    leases = store.leases(lease_seconds)
    taken: dict[int, float] = {}
    for epoch in range(1, leases.latest(job_id) + 1):
        body = store.objects.get(leases.run_key(job_id, epoch))
        if body is not None:
            taken[epoch] = float(body.decode().split()[1])
    first: float | None = None
    last: float | None = None
    raw = store.read_artifact(job_id, "trajectory") if final is not None else None
    for line in (raw or b"").decode().splitlines():
        entry = json.loads(line)
        if entry.get("type") == "command" and first is None:
            first = float(entry["ts"]) - float(entry["seconds"])
        if "ts" in entry:
            last = float(entry["ts"])
    return JobTimeline(
        id=job_id,
        accepted_ms=job.created_at_ms if job is not None else 0,
        events=store.events(job_id, 0),
        status=final.status.value if final is not None else None,
        passed=final.result.passed if final is not None and final.result else None,
        run=final.run if final is not None else None,
        leases=taken,
        first_command_started=first,
        last_entry_at=last,
    )


class JobsStack:
    """The servers, gateway and fleet of one benchmark run, in ``work``: room for
    ``outstanding`` unfinished jobs of the one key, the workers' Kafka ``assignment``,
    and how often they schedule batches (``batch_poll_seconds``)."""

    def __init__(
        self,
        work: Path,
        outstanding: int,
        assignment: str,
        batch_poll_seconds: float = 2.0,
        auth: dict[str, Any] | None = None,
        jobs: dict[str, Any] | None = None,
    ) -> None:
        """``auth``: the gateway's ``auth`` tree (none: no keys); ``jobs``: settings merged
        over the ``jobs`` tree (one level deep), the workers' included."""
        self.work = work
        self.outstanding = outstanding
        self.assignment = assignment
        self.batch_poll_seconds = batch_poll_seconds
        self.auth = auth
        self.jobs_overrides = jobs or {}
        self.s3: ObjectStore = object_store(work / "s3", work / "seaweedfs.log")
        self.broker: Server | None = None
        self.children: list[subprocess.Popen[bytes]] = []
        self.fleet: WorkerFleet | None = None

    def stop(self) -> None:
        if self.fleet is not None:
            say("stopping the workers")
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
        """Everything but the workers (:attr:`fleet` adds them); the gateway's URL and
        the jobs settings."""
        say("starting SeaweedFS and Tansu")
        self.s3.start()
        ensure_bucket(self.s3.url, BROKER_BUCKET)
        self.broker = broker(free_port(), self.s3.url, self.work / "tansu.log").start()
        model_port, gateway_port, metrics_port = free_port(), free_port(), free_port()
        self.children.append(
            _spawn(
                [sys.executable, "-m", "tiergate.bench.stub_model", str(model_port)],
                child_env(),
                self.work / "stub-model.log",
            )
        )
        model_url = f"http://127.0.0.1:{model_port}"
        gateway_url = f"http://127.0.0.1:{gateway_port}"
        jobs = jobs_tree(
            self.broker.address,
            self.s3.url,
            gateway_url,
            self.work,
            self.outstanding,
            self.assignment,
            self.batch_poll_seconds,
        )
        for key, value in self.jobs_overrides.items():
            merged = isinstance(value, dict) and isinstance(jobs.get(key), dict)
            jobs[key] = {**jobs[key], **value} if merged else value
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
                    **({"auth": self.auth} if self.auth else {}),
                }
            )
        )
        say("starting the stub model and the gateway")
        if not wait_until(lambda: _answers(f"{model_url}/health"), 30, 0.2):
            raise RuntimeError(f"the stub model did not start; see {self.work}/stub-model.log")
        self.children.append(
            _spawn(
                [sys.executable, "-m", "tiergate", "serve"],
                child_env(config),
                self.work / "gateway.log",
            )
        )
        if not wait_until(lambda: _answers(f"{gateway_url}/readyz"), 60, 0.3):
            raise RuntimeError(f"the gateway is not ready; see {self.work}/gateway.log")
        self.fleet = WorkerFleet(jobs, self.work, child_env())
        return gateway_url, settings

    def close_fleet(self) -> WorkerFleet:
        """Stop the workers (they drain); the fleet, for its counts."""
        assert self.fleet is not None
        fleet = self.fleet
        say("stopping the workers")
        fleet.close()
        self.fleet = None
        return fleet


def new_work_dir() -> Path:
    """A run's folder under /tmp, with the local store's credentials in this process."""
    work = Path(tempfile.mkdtemp(prefix="tiergate-bench-jobs-", dir="/tmp"))
    work.chmod(0o755)  # the sandbox's unprivileged users reach their workspaces below
    for key, value in LOCAL_CREDENTIALS.items():
        os.environ.setdefault(key, value)
    return work


def keep_logs(work: Path) -> None:
    """Delete the run's data (object store, sandboxes, cache); keep its logs and settings
    files (workers.log, gateway.log, tansu.log, seaweedfs.log) for a look afterwards."""
    for data in ("s3", "sandboxes", "cache"):
        shutil.rmtree(work / data, ignore_errors=True)
    say(f"logs kept in {work}")


def fleet_figures(fleet: WorkerFleet) -> dict[str, Any]:
    """The fleet's own counts, as both reports give them."""
    return {
        "workers_started": fleet.started,
        "workers_unhealthy_at_removal": fleet.unhealthy_at_removal,
        "workers_killed_after_drain": fleet.killed_after_drain,
        "worker_exit_codes": sorted(set(fleet.exit_codes.values())),
    }
