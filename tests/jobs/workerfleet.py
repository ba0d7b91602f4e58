"""Real ``tiergate worker`` processes for the tests that start, stop and kill them: each
with a metrics port of its own, its health read before it is scaled in."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.jobstack import JobsStack
from tests.servers import free_port
from tests.waiting import eventually
from tiergate.local.jobs import start_worker


class Fleet:
    """Worker processes with their own metrics ports, started and stopped on demand."""

    def __init__(self, stack: JobsStack, tmp_path: Path, **worker: Any) -> None:
        self.stack = stack
        self.tmp_path = tmp_path
        self.worker = worker
        self.procs: dict[int, tuple[subprocess.Popen[bytes], int]] = {}
        self.log = tmp_path / "workers.log"
        self.unhealthy: list[str] = []

    def start(self) -> subprocess.Popen[bytes]:
        jobs = self.stack.jobs.model_dump(mode="json")
        jobs["kafka"]["session_timeout_ms"] = 3000
        port = free_port()
        jobs["worker"].update({"metrics_port": port, "metrics_host": "127.0.0.1"}, **self.worker)
        config = self.tmp_path / f"worker-{port}.yaml"
        config.write_text(yaml.safe_dump({"jobs": jobs, "gateway": {"log_requests": False}}))
        proc = start_worker({**os.environ, "TIERGATE_CONFIG": str(config)}, self.log)
        self.procs[proc.pid] = (proc, port)
        eventually(lambda: self.healthy(proc.pid), 60, 0.2, f"worker up; see {self.log}")
        return proc

    def healthy(self, pid: int) -> bool:
        try:
            resp = httpx.get(f"http://127.0.0.1:{self.procs[pid][1]}/healthz", timeout=2)
        except httpx.HTTPError:
            return False
        return resp.status_code == 200

    def stop(self, pid: int) -> None:
        """Scale one in: its health first (a dead thread would show), then SIGTERM."""
        if not self.healthy(pid):
            self.unhealthy.append(str(pid))
        proc, _ = self.procs.pop(pid)
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def kill(self, pid: int) -> None:
        """A worker dies at once (SIGKILL): no drain, no release of what it held."""
        proc, _ = self.procs.pop(pid)
        proc.kill()
        proc.wait()

    def close(self) -> None:
        for pid in list(self.procs):
            proc, _ = self.procs.pop(pid)
            proc.kill()
            proc.wait()


@contextmanager
def fleet(stack: JobsStack, tmp_path: Path, **worker: Any) -> Iterator[Fleet]:
    workers = Fleet(stack, tmp_path, **worker)
    try:
        yield workers
    finally:
        workers.close()
