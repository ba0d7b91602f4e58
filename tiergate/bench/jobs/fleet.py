"""The jobs benchmark's worker fleet: ``tiergate worker`` processes, each with its own
settings file, metrics port and sandbox uid range (``sandbox.uids`` per worker on one host),
added and removed (SIGTERM: they drain) as an autoscaler would."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from tiergate.local.jobs import start_worker
from tiergate.measure.ports import free_port
from tiergate.measure.wait import wait_until

CONCURRENCY = 2
DRAIN_SECONDS = 10.0
SANDBOX_UIDS = 2  # each worker's own uid range (sandbox.uids), one uid per slot


@dataclass(frozen=True)
class FleetParams:
    """What every fleet benchmark run (jobs, rollout batches) does to its workers."""

    max_workers: int = 4
    churn_seconds: float = 10.0
    broker_restart: bool = True
    deadline_seconds: float = 600.0
    short: bool = False
    assignment: str = "cooperative-sticky"  # jobs.kafka.assignment of the workers


@dataclass
class FleetWorker:
    """One worker process and its metrics port; ``leaving_since``: SIGTERM sent."""

    proc: subprocess.Popen[bytes]
    port: int
    leaving_since: float | None = None


@dataclass
class WorkerFleet:
    """``tiergate worker`` processes with the ``jobs`` settings tree given; removed ones
    are reaped without waiting (killed past the drain and 15 s)."""

    jobs: dict[str, Any]
    work: Path
    env: dict[str, str]
    workers: list[FleetWorker] = field(default_factory=list)
    started: int = 0
    unhealthy_at_removal: list[int] = field(default_factory=list)
    killed_after_drain: list[int] = field(default_factory=list)
    exit_codes: dict[int, int] = field(default_factory=dict)

    @property
    def log(self) -> Path:
        return self.work / "workers.log"

    @property
    def serving(self) -> list[FleetWorker]:
        return [w for w in self.workers if w.leaving_since is None]

    def healthy(self, worker: FleetWorker) -> bool:
        try:
            resp = httpx.get(f"http://127.0.0.1:{worker.port}/healthz", timeout=2)
        except httpx.HTTPError:
            return False
        return resp.status_code == 200

    def add(self) -> FleetWorker:
        jobs = json.loads(json.dumps(self.jobs))
        port = free_port()
        jobs["worker"].update(metrics_port=port)
        jobs["sandbox"].update(uid=100000 + SANDBOX_UIDS * self.started, uids=SANDBOX_UIDS)
        self.started += 1
        config = self.work / f"worker-{port}.yaml"
        config.write_text(yaml.safe_dump({"jobs": jobs, "gateway": {"log_requests": False}}))
        proc = start_worker({**self.env, "TIERGATE_CONFIG": str(config)}, self.log)
        worker = FleetWorker(proc, port)
        self.workers.append(worker)
        if not wait_until(lambda: self.healthy(worker) or proc.poll() is not None, 60, 0.2):
            raise RuntimeError(f"worker {proc.pid} not healthy after 60 s; see {self.log}")
        if proc.poll() is not None:
            raise RuntimeError(f"worker {proc.pid} exited ({proc.returncode}); see {self.log}")
        return worker

    def remove(self) -> int:
        """SIGTERM the oldest serving worker (its health checked first: a dead thread
        shows there); returns its pid."""
        worker = self.serving[0]
        if not self.healthy(worker):
            self.unhealthy_at_removal.append(worker.proc.pid)
        worker.proc.terminate()
        worker.leaving_since = time.monotonic()
        return worker.proc.pid

    def reap(self) -> None:
        for worker in list(self.workers):
            code = worker.proc.poll()
            if code is not None:
                self.exit_codes[worker.proc.pid] = code
                self.workers.remove(worker)
            elif (
                worker.leaving_since is not None
                and time.monotonic() - worker.leaving_since > DRAIN_SECONDS + 15
            ):
                self.killed_after_drain.append(worker.proc.pid)
                worker.proc.kill()

    def _reaped(self) -> bool:
        self.reap()
        return not self.workers

    def close(self) -> None:
        for worker in self.serving:
            worker.proc.terminate()
            worker.leaving_since = time.monotonic()
        wait_until(self._reaped, DRAIN_SECONDS + 20, 0.2)
        for worker in self.workers:
            worker.proc.kill()
            worker.proc.wait()
