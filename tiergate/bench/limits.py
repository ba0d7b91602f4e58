"""Per-request cost of authentication and per-key limits, with Redis and without.

Runs the gateway's own gatekeeper (the code on the request path: key lookup, the limits
script, admission, the settlement) sequentially in one event loop, against a real Redis on
loopback started for the run, and reports the time added over a gateway with auth off.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tiergate.bench.report import write_report
from tiergate.gateway.access.admission import Admission
from tiergate.gateway.access.auth import new_key
from tiergate.gateway.access.gatekeeper import Gatekeeper
from tiergate.gateway.access.limits import Limiter
from tiergate.gateway.metrics import GatewayMetrics
from tiergate.gateway.openai.selection import inspect
from tiergate.measure.ports import free_ports, port_open
from tiergate.measure.wait import wait_until
from tiergate.settings import load_settings

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hello " * 50}]})


def _say(message: str) -> None:
    print(f"[bench limits] {message}", file=sys.stderr, flush=True)


async def _measure(gatekeeper: Gatekeeper, header: str | None, n: int) -> list[float]:
    req = inspect(BODY.encode(), None, 512)
    samples = []
    for i in range(n + 200):
        started = time.perf_counter()
        caller = gatekeeper.authenticate(header)
        decision = gatekeeper.decide(caller, req)
        lease = await gatekeeper.admit(caller, req, decision, f"bench-{i}")
        lease.end({"total_tokens": 120})
        if i >= 200:  # warm-up excluded
            samples.append((time.perf_counter() - started) * 1e6)
        await asyncio.sleep(0)  # let the settlement go out, as between real requests
    return samples


def _gatekeeper(tree: dict[str, Any]) -> Gatekeeper:
    settings = load_settings(**tree)
    admission = Admission(settings.admission, {})
    return Gatekeeper(settings, Limiter(settings.limits), admission, GatewayMetrics({}))


def _summary(samples: list[float], base: list[float]) -> dict[str, float]:
    p99 = sorted(samples)[int(0.99 * len(samples))]
    base_p99 = sorted(base)[int(0.99 * len(base))]
    return {
        "p50_us": statistics.median(samples),
        "p99_us": p99,
        "added_p50_us": statistics.median(samples) - statistics.median(base),
        "added_p99_us": p99 - base_p99,
    }


def run_limits_benchmark(out: Path, requests: int) -> dict[str, Any]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("the benchmark needs redis-server: apt-get install -y redis-server")
    port = free_ports()[0]
    redis = subprocess.Popen(
        [binary, "--port", str(port), "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL
    )
    # Redis listening, not a fixed pause; one that never does fails the first request.
    wait_until(lambda: port_open(port), 10.0, 0.05)
    key, digest = new_key()
    limits = {"requests_per_minute": 10**9, "tokens_per_minute": 10**12, "max_concurrent": 10**6}
    auth = {"enabled": True, "keys": [{"name": "bench", "hash": digest, "limits": limits}]}
    header = f"Bearer {key}"
    try:
        _say(f"{requests} requests each: auth off; auth + local limits; auth + Redis limits")

        async def run() -> dict[str, list[float]]:
            off = _gatekeeper({})
            local = _gatekeeper({"auth": auth})
            shared = _gatekeeper(
                {"auth": auth, "limits": {"redis_url": f"redis://127.0.0.1:{port}/0"}}
            )
            results = {
                "auth_off": await _measure(off, None, requests),
                "auth_local_limits": await _measure(local, header, requests),
                "auth_redis_limits": await _measure(shared, header, requests),
            }
            assert shared.limiter.shared, "Redis was not used"
            await shared.limiter.close()
            import redis.asyncio as aioredis

            client = aioredis.Redis.from_url(f"redis://127.0.0.1:{port}/0")
            pings = []
            for i in range(requests + 200):
                started = time.perf_counter()
                await client.ping()
                if i >= 200:
                    pings.append((time.perf_counter() - started) * 1e6)
            await client.aclose()
            results["redis_ping"] = pings
            return results

        raw = asyncio.run(run())
    finally:
        redis.terminate()
        redis.wait(10)
    report = {
        "requests": requests,
        "auth_off": {
            "p50_us": statistics.median(raw["auth_off"]),
            "p99_us": sorted(raw["auth_off"])[int(0.99 * requests)],
        },
        "auth_local_limits": _summary(raw["auth_local_limits"], raw["auth_off"]),
        "auth_redis_limits": _summary(raw["auth_redis_limits"], raw["auth_off"]),
        "redis_ping": {
            "p50_us": statistics.median(raw["redis_ping"]),
            "p99_us": sorted(raw["redis_ping"])[int(0.99 * requests)],
        },
    }
    write_report(out, "limits-bench", report, render(report))
    return report


def render(r: dict[str, Any]) -> str:
    rows = [
        "# Per-request cost of auth and limits",
        "",
        f"Command: `tiergate bench limits --requests {r['requests']}` "
        "(sequential, one event loop, Redis on loopback)",
        "",
        "| configuration | p50 (us) | p99 (us) | added p50 (us) | added p99 (us) |",
        "|---|---|---|---|---|",
        f"| auth off | {r['auth_off']['p50_us']:.1f} | {r['auth_off']['p99_us']:.1f} | | |",
    ]
    for name, label in (
        ("auth_local_limits", "auth + in-process limits"),
        ("auth_redis_limits", "auth + Redis limits"),
    ):
        s = r[name]
        rows.append(
            f"| {label} | {s['p50_us']:.1f} | {s['p99_us']:.1f} | "
            f"{s['added_p50_us']:.1f} | {s['added_p99_us']:.1f} |"
        )
    ping = r["redis_ping"]
    rows.append(
        f"| (floor: one redis-py PING round trip) | {ping['p50_us']:.1f} | "
        f"{ping['p99_us']:.1f} | | |"
    )
    return "\n".join([*rows, ""])
