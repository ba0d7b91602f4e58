"""`tiergate serve --workers 2`: two processes on one port, each serving completions and
health, and /metrics (from whichever process answers) counting the requests of both."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.servers import free_port
from tests.waiting import eventually

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


def _requests_total(text: str) -> float:
    line = re.compile(r'^tiergate_requests_total\{[^}]*status="200"[^}]*\} (\S+)$', re.M)
    return sum(float(m.group(1)) for m in line.finditer(text))


@pytest.fixture
def two_workers(fakes: list[FakeVllm], tmp_path: Path) -> Iterator[tuple[str, Path]]:
    config = tmp_path / "tiergate.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "tiers": {
                    "standard": {"endpoints": [fakes[0].url]},
                    "fast": {"endpoints": [fakes[2].url]},
                },
                "health": {"interval_seconds": 0.5},
                # Scraped where the requests go: any process answers either way.
                "gateway": {
                    "log_requests": False,
                    "metrics_port": None,
                    "metrics_on_serving_port": True,
                },
            }
        )
    )
    folder = tmp_path / "metrics"
    port = free_port()
    env = {
        **os.environ,
        "TIERGATE_CONFIG": str(config),
        # The test names the folder to see which processes counted requests.
        "PROMETHEUS_MULTIPROC_DIR": str(folder),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "tiergate", "serve", "--port", str(port), "--workers", "2"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        # Ready: both workers up (each writes its tiergate_up gauge file at start).
        def ready() -> bool:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            return len(list(folder.glob("gauge_max_*.db"))) >= 2 and _ready(base)

        eventually(ready, 60, 0.1, "the two workers ready")
        yield base, folder
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _ready(base: str) -> bool:
    try:
        return httpx.get(f"{base}/readyz").json()["tiers_serving"] is True
    except (httpx.TransportError, ValueError, KeyError):
        return False


def _one(base: str) -> int:
    # A new connection per request, so that the kernel may hand it to either process.
    with httpx.Client() as client:
        return client.post(f"{base}/v1/chat/completions", json=CHAT).status_code


def test_two_workers_serve_and_metrics_count_both(two_workers: tuple[str, Path]) -> None:
    base, folder = two_workers
    sent = 0
    with ThreadPoolExecutor(16) as pool:
        # Until both processes have counted a request (each writes its own counter file).
        for _ in range(20):
            statuses = list(pool.map(lambda _: _one(base), range(32)))
            assert statuses == [200] * 32
            sent += 32
            if len(list(folder.glob("counter_*.db"))) >= 2:
                break
    assert len(list(folder.glob("counter_*.db"))) == 2, "one process served every request"
    # A request is counted just after its answer is handed to the connection: the last
    # ones may land a moment after their client had them.
    eventually(
        lambda: _requests_total(httpx.get(f"{base}/metrics").text) == sent,
        10,
        what="every answered request counted",
    )
    # Any process answers a scrape with the requests of both.
    for _ in range(6):
        with httpx.Client() as client:
            scraped = client.get(f"{base}/metrics")
        assert scraped.status_code == 200
        assert _requests_total(scraped.text) == sent
        assert "tiergate_up 1.0" in scraped.text
        # The per-process collectors still show up beside the summed counters.
        assert "tiergate_endpoint_healthy{" in scraped.text
        assert "tiergate_admission_in_flight{" in scraped.text
