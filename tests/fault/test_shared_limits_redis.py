"""Limits shared by two gateway processes through a real Redis, what happens when Redis
goes away (the gateways keep serving with local limits and say so), and that they share
again once it is back."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
import yaml

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.fault.helpers import metric_value
from tests.servers import free_port
from tests.waiting import eventually
from tiergate.accesssettings import KeyLimits, LimitSettings
from tiergate.gateway.access.auth import new_key
from tiergate.gateway.access.limits import Limiter
from tiergate.measure.ports import port_open

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


class RedisServer:
    def __init__(self) -> None:
        self.port = free_port()
        self.start()

    def start(self) -> None:
        """Start (again, on the same port: as a restarted Redis behind its address)."""
        binary = shutil.which("redis-server")
        assert binary, "redis-server is missing: scripts/bootstrap.sh installs it"
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        eventually(lambda: port_open(self.port), 10, 0.05, "redis-server started")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    yield server
    server.stop()


def _start_gateway(config: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "TIERGATE_CONFIG": str(config), "TIERGATE_GATEWAY__PORT": str(port)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tiergate", "serve"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        try:
            return httpx.get(f"{base}/readyz").status_code == 200
        except httpx.TransportError:
            return False

    eventually(ready, 30, 0.1, "the gateway ready")
    return proc, base


def test_limit_holds_across_two_gateways_and_survives_redis_loss(
    fakes: list[FakeVllm], redis_server: RedisServer, tmp_path: Path
) -> None:
    key, digest = new_key()
    # A second key whose requests make each gateway try Redis again, without spending the
    # shared key's budget.
    probe, probe_digest = new_key()
    config = tmp_path / "tiergate.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "tiers": {
                    "standard": {"endpoints": [fakes[0].url]},
                    "fast": {"endpoints": [fakes[2].url]},
                },
                "health": {"interval_seconds": 0.5},
                "auth": {
                    "enabled": True,
                    "keys": [
                        {"name": "shared", "hash": digest, "limits": {"requests_per_minute": 6}},
                        {"name": "probe", "hash": probe_digest},
                    ],
                },
                "limits": {"redis_url": redis_server.url, "redis_retry_seconds": 1},
                # Two gateways side by side: /metrics on their serving ports, not one 9300.
                "gateway": {
                    "log_requests": False,
                    "metrics_port": None,
                    "metrics_on_serving_port": True,
                },
            }
        )
    )
    gateways = [_start_gateway(config) for _ in range(2)]
    try:
        headers = {"authorization": f"Bearer {key}"}
        codes = []
        for i in range(8):
            base = gateways[i % 2][1]
            codes.append(
                httpx.post(f"{base}/v1/chat/completions", json=CHAT, headers=headers).status_code
            )
        # Six per minute in all, whichever gateway is asked: each alone would allow six.
        assert codes == [200] * 6 + [429, 429]
        for _, base in gateways:
            assert metric_value(base, "tiergate_ratelimit_redis_up") == 1

        redis_server.stop()
        for _, base in gateways:
            resp = httpx.post(f"{base}/v1/chat/completions", json=CHAT, headers=headers)
            # Each replica now counts alone, from a full bucket: it serves.
            assert resp.status_code == 200, resp.text
            assert metric_value(base, "tiergate_ratelimit_redis_up") == 0
            unauthenticated = httpx.post(f"{base}/v1/chat/completions", json=CHAT)
            assert unauthenticated.status_code == 401

        # Redis back (empty, as a restarted one is): each gateway goes back to it within its
        # retry interval, and the two share the key's six a minute again.
        redis_server.start()
        probing = {"authorization": f"Bearer {probe}"}

        def shared_again() -> bool:
            for _, base in gateways:
                httpx.post(f"{base}/v1/chat/completions", json=CHAT, headers=probing)
            return all(metric_value(b, "tiergate_ratelimit_redis_up") == 1 for _, b in gateways)

        eventually(shared_again, 30, 0.5, "both gateways using Redis again")
        codes = []
        for i in range(8):
            base = gateways[i % 2][1]
            codes.append(
                httpx.post(f"{base}/v1/chat/completions", json=CHAT, headers=headers).status_code
            )
        assert codes == [200] * 6 + [429, 429]
    finally:
        logs = []
        for proc, _ in gateways:
            proc.terminate()
            _, err = proc.communicate(timeout=10)
            logs.append(err.decode())
    assert any("redis unreachable" in log for log in logs)


def test_a_replica_whose_clock_runs_ahead_keeps_the_others_leases(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = LimitSettings(redis_url=redis_server.url)
    limits = KeyLimits(max_concurrent=2)
    real_time = time.time

    async def scenario() -> None:
        honest, skewed = Limiter(settings), Limiter(settings)
        try:
            assert (await honest.admit("k", limits, 1, "a")).allowed
            with monkeypatch.context() as patch:
                # An hour ahead: past the honest replica's lease by its own clock.
                patch.setattr(time, "time", lambda: real_time() + 3600)
                assert (await skewed.admit("k", limits, 1, "b")).allowed
                third = await skewed.admit("k", limits, 1, "c")
            assert not third.allowed and third.reason == "concurrency"
        finally:
            await honest.close()
            await skewed.close()

    asyncio.run(scenario())


def test_a_lease_renewed_past_its_first_expiry_still_counts(redis_server: RedisServer) -> None:
    settings = LimitSettings(redis_url=redis_server.url)
    limits = KeyLimits(max_concurrent=1)
    store = redis.Redis.from_url(redis_server.url)
    leases = "tiergate:rl:{k}:conc"

    def redis_ms() -> float:
        seconds, micros = store.time()
        return seconds * 1000 + micros / 1000

    async def scenario() -> None:
        limiter = Limiter(settings, lease_ms=600)
        try:
            assert (await limiter.admit("k", limits, 1, "long")).allowed
            first_expiry = store.zscore(leases, "long")
            assert first_expiry is not None
            # Redis's clock well past the first expiry (three renewals' worth), the request
            # still running: its lease has been renewed and still holds the only slot.
            await asyncio.to_thread(
                eventually,
                lambda: redis_ms() > first_expiry + 1200,
                10,
                0.05,
                "Redis's clock past the lease's first expiry",
            )
            assert (store.zscore(leases, "long") or 0) > redis_ms()
            refused = await limiter.admit("k", limits, 1, "next")
            assert not refused.allowed and refused.reason == "concurrency"
            limiter.settle("k", 0, "long", shared=True)
            await asyncio.to_thread(
                eventually, lambda: store.zcard(leases) == 0, 5, 0.05, "the lease ended"
            )
            assert (await limiter.admit("k", limits, 1, "next")).allowed
        finally:
            await limiter.close()
            store.close()

    asyncio.run(scenario())
