"""A worker says on ``/healthz`` how much disk its sandboxes have left, and whether that is
enough, without failing the probe (a restart frees nothing and kills running jobs)."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.fakes.fake_vllm import FakeVllm
from tests.jobstack import jobs_stack
from tests.waiting import eventually
from tiergate.measure.diskspace import MIB, disk_space


def test_healthz_shows_the_sandboxes_disk_and_a_shortage_of_it(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    with jobs_stack(broker, s3, model, tmp_path) as stack:
        free_mb = disk_space(Path(stack.jobs.sandbox.work_dir), 0).free // MIB
        # More than this disk will ever have:
        jobs = stack.worker_settings(min_free_mb=free_mb * 1000)
        stack.start_worker(jobs, serve_http=True)
        url = f"http://127.0.0.1:{jobs.worker.metrics_port}/healthz"
        resp = eventually(lambda: httpx.get(url, timeout=2), 30, 0.2)
        assert resp.status_code == 200, resp.text  # the liveness probe still passes
        disk = resp.json()["disk"]
        assert disk["path"] == jobs.sandbox.work_dir
        assert disk["ok"] is False
        assert disk["min_free_mb"] == free_mb * 1000
        assert 0 < disk["free_mb"] < disk["min_free_mb"]

        jobs.worker.min_free_mb = 0
        assert httpx.get(url, timeout=2).json()["disk"]["ok"] is True
