"""A worker says on ``/healthz`` how much disk its sandboxes have left, and whether that is
enough, without failing the probe (a restart frees nothing and kills running jobs)."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.fakes.fake_vllm import FakeVllm
from tests.jobstack import jobs_stack
from tests.servers import free_port
from tests.waiting import eventually
from tiergate.measure.diskspace import MIB, disk_space
from tiergate.queue.worker import Worker


def test_healthz_shows_the_sandboxes_disk_and_a_shortage_of_it(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    with jobs_stack(broker, s3, model, tmp_path) as stack:
        port = free_port()
        jobs = stack.jobs.model_copy(deep=True)
        jobs.worker.metrics_port, jobs.worker.metrics_host = port, "127.0.0.1"
        free_mb = disk_space(Path(jobs.sandbox.work_dir), 0).free // MIB
        jobs.worker.min_free_mb = free_mb * 1000  # more than this disk will ever have
        worker = Worker(jobs, serve_http=True)
        worker.start()
        stack.workers.append(worker)
        url = f"http://127.0.0.1:{port}/healthz"
        resp = eventually(lambda: httpx.get(url, timeout=2), 30, 0.2)
        assert resp.status_code == 200, resp.text  # the liveness probe still passes
        disk = resp.json()["disk"]
        assert disk["path"] == jobs.sandbox.work_dir
        assert disk["ok"] is False
        assert disk["min_free_mb"] == free_mb * 1000
        assert 0 < disk["free_mb"] < disk["min_free_mb"]

        jobs.worker.min_free_mb = 0
        assert httpx.get(url, timeout=2).json()["disk"]["ok"] is True
