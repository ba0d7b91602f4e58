"""The README's shutdown: `tiergate serve` told to stop (SIGTERM, as Kubernetes does) while a
stream is in flight lets that stream finish, to its `[DONE]`, within
`gateway.shutdown_grace_seconds`, refuses new connections meanwhile, and exits. A real
`tiergate serve` process over FakeVllm (a fake engine, named as one) streaming slowly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import yaml

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.servers import free_port
from tests.waiting import eventually

CHUNKS, CHUNK_SECONDS = 6, 0.5  # the stream takes about 3 s; the grace is 30 s


def test_sigterm_lets_an_open_stream_finish_then_exits(
    fakes: list[FakeVllm], tmp_path: Path
) -> None:
    fakes[0].behaviour.chunks = CHUNKS
    fakes[0].behaviour.chunk_delay = CHUNK_SECONDS
    config = tmp_path / "tiergate.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "tiers": {
                    "standard": {"endpoints": [fakes[0].url]},
                    "fast": {"endpoints": [fakes[2].url]},
                },
                "gateway": {"log_requests": False, "metrics_port": None},
            }
        )
    )
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tiergate", "serve", "--port", str(port)],
        env={**os.environ, "TIERGATE_CONFIG": str(config)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            try:
                return httpx.get(f"{base}/readyz").json()["tiers_serving"] is True
            except (httpx.TransportError, ValueError, KeyError):
                return False

        eventually(ready, 60, 0.1, "the gateway ready")
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
        lines: list[str] = []
        first = threading.Event()

        def stream() -> None:
            with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        lines.append(line)
                        first.set()

        reader = threading.Thread(target=stream)
        reader.start()
        assert first.wait(30), "the stream began"
        proc.send_signal(signal.SIGTERM)
        stopped_at = time.monotonic()
        # New connections are refused while the stream drains.
        eventually(
            lambda: _refused(base), 10, 0.05, "new connections refused once SIGTERM was sent"
        )
        reader.join(60)
        assert lines and lines[-1] == "data: [DONE]", lines[-3:]
        assert len([line for line in lines if '"content"' in line]) == CHUNKS, lines
        # uvicorn ends by raising the signal it caught again, once it has shut down.
        assert proc.wait(30) in (0, -signal.SIGTERM)
        assert time.monotonic() - stopped_at < 30  # within shutdown_grace_seconds
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _refused(base: str) -> bool:
    try:
        httpx.get(f"{base}/healthz", timeout=1)
    except httpx.TransportError:
        return True
    return False
