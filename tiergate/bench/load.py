"""Load generators of the gateway benchmark: open-loop fixed rate, one at a time, streams,
and wrk at saturation, all against one OpenAI-style URL."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import statistics
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp

MODEL = "bench-model"
CHAT_BODY = json.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
)
STREAM_CHUNKS, STREAM_GAP_MS = 20, 10.0
FIXED_RATE = 60.0
SEQUENTIAL_REQUESTS = 200
OVERHEAD_HEADER = "x-tiergate-overhead-ms"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def post_chat(session: aiohttp.ClientSession, url: str) -> str | None:
    """One non-streaming chat request, read whole; the gateway's overhead header if any."""
    async with session.post(
        url, data=CHAT_BODY, headers={"content-type": "application/json"}
    ) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}")
        return resp.headers.get(OVERHEAD_HEADER)


async def fixed_rate(urls: Sequence[str], rate: float, duration: float) -> list[list[float]]:
    """Open-loop load on every URL at once, each at ``rate`` requests/s whatever the answers
    do: in each 1/rate period one request to each URL, spread evenly through it (at 60
    req/s and three URLs, a request every 5.6 ms, each URL's own 16.7 ms apart). The
    systems are so measured in the same seconds, not one after another: this machine's
    speed moves within seconds, and measured 5 s apart, two proxies' difference moved by
    as much as the target's 0.5 ms margin from run to run. Latencies per URL, in order."""
    latencies: list[list[float]] = [[] for _ in urls]
    async with contextlib.AsyncExitStack() as stack:
        sessions = [
            await stack.enter_async_context(
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256))
            )
            for _ in urls
        ]

        async def one(k: int) -> None:
            started = time.perf_counter()
            await post_chat(sessions[k], urls[k])
            latencies[k].append((time.perf_counter() - started) * 1000.0)

        for _ in range(50):  # warm the connection pools
            for k in range(len(urls)):
                await one(k)
        for found in latencies:
            found.clear()
        tasks = []
        step = 1.0 / (rate * len(urls))
        start = time.perf_counter()
        for i in range(max(1, int(rate * duration)) * len(urls)):
            delay = start + i * step - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i % len(urls))))
        await asyncio.gather(*tasks)
    return latencies


async def sequential(url: str, requests: int) -> dict[str, list[float]]:
    """One request at a time on one keep-alive connection; the gateway's own overhead
    header too, where the answer has one."""
    latencies: list[float] = []
    reported: list[float] = []
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=connector) as session:
        for i in range(requests + 20):
            started = time.perf_counter()
            header = await post_chat(session, url)
            if i < 20:  # warm-up
                continue
            latencies.append((time.perf_counter() - started) * 1000.0)
            if header is not None:
                reported.append(float(header))
    return {"latency_ms": latencies, "reported_overhead_ms": reported}


async def stream_lateness(url: str, requests: int) -> dict[str, list[float]]:
    """Per stream: time to first chunk; per chunk, its lateness: the time from the backend
    writing it (its ``sent_at``, on the machine's monotonic clock) to this client reading
    it. Through a proxy, that is what the proxy holds a chunk back; direct, the floor."""
    ttfb: list[float] = []
    late: list[float] = []
    # The streaming fake serves the fast tier in this set-up.
    body = json.loads(CHAT_BODY) | {"stream": True, "service_tier": "priority"}
    async with aiohttp.ClientSession() as session:
        for _ in range(requests):
            started = time.perf_counter()
            first: float | None = None
            async with session.post(url, json=body) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"{url}: HTTP {resp.status}")
                buffer = b""
                async for chunk in resp.content.iter_any():
                    now, received = time.perf_counter(), time.monotonic()
                    buffer += chunk
                    while b"\n\n" in buffer:
                        event, buffer = buffer.split(b"\n\n", 1)
                        if b'"delta"' not in event:
                            continue
                        first = now if first is None else first
                        sent_at = json.loads(event[len(b"data: ") :])["sent_at"]
                        late.append((received - float(sent_at)) * 1000.0)
            if first is None:
                raise RuntimeError(f"{url}: a stream without chunks")
            ttfb.append((first - started) * 1000.0)
    return {"ttfb_ms": ttfb, "chunk_lateness_ms": late}


def wrk(url: str, workdir: Path, duration: float) -> dict[str, float]:
    script = workdir / "post.lua"
    script.write_text(
        'wrk.method = "POST"\n'
        f"wrk.body = {json.dumps(CHAT_BODY)}\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
    )
    out = subprocess.run(
        [
            "taskset",
            "-c",
            "1",
            "wrk",
            "-t1",
            "-c32",
            f"-d{max(1, round(duration))}s",
            "--latency",
            "-s",
            str(script),
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    lat = dict(re.findall(r"^\s+(50|99)%\s+([\d.]+\w+)", out, re.M))
    return {
        "rps": rps,
        "non_2xx": float(non2xx.group(1)) if non2xx else 0.0,
        "p50_ms": _to_ms(lat.get("50", "0ms")),
        "p99_ms": _to_ms(lat.get("99", "0ms")),
    }


def combined(slices: Sequence[dict[str, float]]) -> dict[str, float]:
    """One saturation figure from wrk runs of equal length: the mean rate, the median of
    their percentiles, every non-2xx answer."""
    return {
        "rps": statistics.fmean(s["rps"] for s in slices),
        "non_2xx": sum(s["non_2xx"] for s in slices),
        "p50_ms": statistics.median(s["p50_ms"] for s in slices),
        "p99_ms": statistics.median(s["p99_ms"] for s in slices),
    }


def _to_ms(text: str) -> float:
    value, unit = re.match(r"([\d.]+)(\w+)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": 0.0, "p99": 0.0, "n": 0}
    return {"p50": statistics.median(values), "p99": percentile(values, 0.99), "n": len(values)}
