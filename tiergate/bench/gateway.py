"""Gateway overhead and throughput, direct versus through the gateway.

The gateway runs as one process pinned to core 0; the zero-cost backends (nginx for plain
responses, ZeroCostFakeBackend for streams) and the load generators share core 1. Three
measurements, each direct and through the gateway:

1. latency at a fixed 200 requests/s (open loop), non-streaming: p50 and p99 added;
2. saturation throughput with wrk (32 connections), non-streaming;
3. streams of 20 chunks 10 ms apart: how late each chunk arrives through the gateway.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp

from tiergate.bench.ports import free_ports

MODEL = "bench-model"
CHAT_BODY = json.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
)
COMPLETION = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hello"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
)
MODELS = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model", "created": 1}]})
STREAM_CHUNKS, STREAM_GAP_MS = 20, 10.0


def _say(message: str) -> None:
    print(f"[bench gateway] {message}", file=sys.stderr, flush=True)


def _nginx_conf(workdir: Path, port: int) -> Path:
    def literal(text: str) -> str:
        return "'" + text.replace("'", "\\'") + "'"

    conf = workdir / "nginx.conf"
    conf.write_text(f"""
daemon off;
worker_processes 1;
pid {workdir}/nginx.pid;
error_log {workdir}/nginx-error.log;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {workdir};
    keepalive_requests 1000000;
    server {{
        listen 127.0.0.1:{port};
        default_type application/json;
        location = /health {{ return 200 ''; }}
        location = /metrics {{ return 200 ''; }}
        location = /v1/models {{ return 200 {literal(MODELS)}; }}
        location / {{ return 200 {literal(COMPLETION)}; }}
    }}
}}
""")
    return conf


def _wait(url: str, budget: float = 30.0) -> None:
    deadline = time.monotonic() + budget
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not become ready")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _fixed_rate(url: str, rate: float, duration: float) -> list[float]:
    """Open-loop load: a request every 1/rate seconds, whatever the answers do."""
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=256)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> None:
            started = time.perf_counter()
            async with session.post(
                url, data=CHAT_BODY, headers={"content-type": "application/json"}
            ) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"{url}: HTTP {resp.status}")
            latencies.append((time.perf_counter() - started) * 1000.0)

        for _ in range(50):  # warm the connection pools
            await one()
        latencies.clear()
        tasks = []
        start = time.perf_counter()
        total = int(rate * duration)
        for i in range(total):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
    return latencies


async def _stream_lateness(url: str, requests: int) -> dict[str, list[float]]:
    """Per stream: time to first chunk, and each later chunk's lateness against its
    schedule (chunk k is due k * gap after the first)."""
    ttfb: list[float] = []
    late: list[float] = []
    # The streaming fake serves the fast tier in this set-up.
    body = json.loads(CHAT_BODY) | {"stream": True, "service_tier": "priority"}
    async with aiohttp.ClientSession() as session:
        for _ in range(requests):
            started = time.perf_counter()
            arrivals: list[float] = []
            async with session.post(url, json=body) as resp:
                buffer = b""
                async for chunk in resp.content.iter_any():
                    now = time.perf_counter()
                    buffer += chunk
                    while b"\n\n" in buffer:
                        event, buffer = buffer.split(b"\n\n", 1)
                        if b'"delta"' in event:
                            arrivals.append(now)
            ttfb.append((arrivals[0] - started) * 1000.0)
            for k, at in enumerate(arrivals[1:], start=1):
                late.append((at - arrivals[0]) * 1000.0 - k * STREAM_GAP_MS)
    return {"ttfb_ms": ttfb, "chunk_lateness_ms": late}


def _wrk(url: str, workdir: Path, duration: float) -> dict[str, float]:
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
            f"-d{int(duration)}s",
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


def _to_ms(text: str) -> float:
    value, unit = re.match(r"([\d.]+)(\w+)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def _summary(values: list[float]) -> dict[str, float]:
    return {"p50": statistics.median(values), "p99": _percentile(values, 0.99), "n": len(values)}


def run_gateway_benchmark(out: Path, duration: float) -> dict[str, Any]:
    for tool in ("nginx", "wrk", "taskset"):
        if shutil.which(tool) is None:
            raise SystemExit(f"the benchmark needs {tool}: apt-get install -y nginx-light wrk")
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("the benchmark pins the gateway and the load to separate cores")
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="tiergate-bench-"))
    nginx_port, stream_port, gw_port = free_ports(3)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        _say("starting nginx and the streaming fake on core 1")
        procs.append(
            subprocess.Popen(
                [
                    "taskset",
                    "-c",
                    "1",
                    "nginx",
                    "-c",
                    str(_nginx_conf(workdir, nginx_port)),
                    "-p",
                    str(workdir),
                ]
            )
        )
        with (workdir / "fake.log").open("wb") as fake_log:
            procs.append(
                subprocess.Popen(
                    [
                        "taskset",
                        "-c",
                        "1",
                        sys.executable,
                        "-m",
                        "tiergate.bench.fake_backend",
                        str(stream_port),
                        str(STREAM_CHUNKS),
                        str(STREAM_GAP_MS),
                    ],
                    stdout=fake_log,
                    stderr=subprocess.STDOUT,
                )
            )
        env = dict(os.environ)
        env.update(
            {
                "TIERGATE_TIERS": json.dumps(
                    {
                        "standard": {"endpoints": [f"http://127.0.0.1:{nginx_port}"]},
                        "fast": {"endpoints": [f"http://127.0.0.1:{stream_port}"]},
                    }
                ),
                "TIERGATE_GATEWAY__PORT": str(gw_port),
            }
        )
        env.pop("TIERGATE_CONFIG", None)
        _say("starting the gateway pinned to core 0 (request logs to a file)")
        with (workdir / "gateway.log").open("wb") as log:
            procs.append(
                subprocess.Popen(
                    ["taskset", "-c", "0", sys.executable, "-m", "tiergate", "serve"],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        _wait(f"http://127.0.0.1:{nginx_port}/health")
        _wait(f"http://127.0.0.1:{stream_port}/health")
        _wait(f"http://127.0.0.1:{gw_port}/readyz")
        os.sched_setaffinity(0, {1})
        direct = f"http://127.0.0.1:{nginx_port}/v1/chat/completions"
        through = f"http://127.0.0.1:{gw_port}/v1/chat/completions"
        results: dict[str, Any] = {"duration_s": duration}

        _say(f"1/3 fixed 200 req/s for {duration:g}s, direct then through the gateway")
        lat_direct = asyncio.run(_fixed_rate(direct, 200, duration))
        lat_gw = asyncio.run(_fixed_rate(through, 200, duration))
        d, g = _summary(lat_direct), _summary(lat_gw)
        results["fixed_rate_200"] = {
            "direct_ms": d,
            "gateway_ms": g,
            "added_p50_ms": g["p50"] - d["p50"],
            "added_p99_ms": g["p99"] - d["p99"],
        }
        _say(f"    added p50 {g['p50'] - d['p50']:.3f} ms, p99 {g['p99'] - d['p99']:.3f} ms")

        _say(f"2/3 saturation with wrk, 32 connections, {duration:g}s each")
        results["saturation"] = {
            "direct": _wrk(direct, workdir, duration),
            "gateway": _wrk(through, workdir, duration),
        }
        _say(
            f"    gateway {results['saturation']['gateway']['rps']:.0f} req/s "
            f"(direct {results['saturation']['direct']['rps']:.0f})"
        )

        _say(f"3/3 streams of {STREAM_CHUNKS} chunks {STREAM_GAP_MS:g} ms apart")
        s_direct = asyncio.run(
            _stream_lateness(f"http://127.0.0.1:{stream_port}/v1/chat/completions", 100)
        )
        s_gw = asyncio.run(_stream_lateness(f"http://127.0.0.1:{gw_port}/v1/chat/completions", 100))
        results["streaming"] = {
            "direct": {k: _summary(v) for k, v in s_direct.items()},
            "gateway": {k: _summary(v) for k, v in s_gw.items()},
        }
        st = results["streaming"]
        _say(
            f"    chunk lateness p50 direct {st['direct']['chunk_lateness_ms']['p50']:.3f} ms, "
            f"gateway {st['gateway']['chunk_lateness_ms']['p50']:.3f} ms"
        )
    except BaseException:
        for name in ("gateway.log", "fake.log"):
            tail = (workdir / name).read_text(errors="replace")[-2000:]
            _say(f"failed; {name} ends with:\n{tail}")
        _say("exit codes: " + ", ".join(str(p.poll()) for p in procs))
        raise
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)
    (out / "gateway-bench.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "gateway-bench.md").write_text(render_markdown(results))
    print(render_markdown(results))
    return results


def _row(label: str, direct: float, gateway: float, digits: int = 3, added: bool = True) -> str:
    diff = f"{gateway - direct:.{digits}f}" if added else ""
    return f"| {label} | {direct:.{digits}f} | {gateway:.{digits}f} | {diff} |"


def render_markdown(r: dict[str, Any]) -> str:
    f = r["fixed_rate_200"]
    s = r["saturation"]
    sd, sg = r["streaming"]["direct"], r["streaming"]["gateway"]
    return "\n".join(
        [
            "# Gateway overhead (one gateway process pinned to one core, zero-cost backend)",
            "",
            f"Command: `tiergate bench gateway --duration {r['duration_s']:g}`",
            "",
            "| measurement | direct | through gateway | added |",
            "|---|---|---|---|",
            _row(
                "non-streaming at 200 req/s, p50 latency (ms)",
                f["direct_ms"]["p50"],
                f["gateway_ms"]["p50"],
            ),
            _row(
                "non-streaming at 200 req/s, p99 latency (ms)",
                f["direct_ms"]["p99"],
                f["gateway_ms"]["p99"],
            ),
            _row(
                "non-streaming saturation, req/s (wrk, 32 connections)",
                s["direct"]["rps"],
                s["gateway"]["rps"],
                0,
                added=False,
            ),
            _row(
                "non-streaming saturation, p50 latency (ms)",
                s["direct"]["p50_ms"],
                s["gateway"]["p50_ms"],
                2,
            ),
            _row(
                "non-streaming saturation, p99 latency (ms)",
                s["direct"]["p99_ms"],
                s["gateway"]["p99_ms"],
                2,
            ),
            _row(
                "streaming: time to first chunk, p50 (ms)",
                sd["ttfb_ms"]["p50"],
                sg["ttfb_ms"]["p50"],
            ),
            _row(
                "streaming: chunk lateness against schedule, p50 (ms)",
                sd["chunk_lateness_ms"]["p50"],
                sg["chunk_lateness_ms"]["p50"],
            ),
            _row(
                "streaming: chunk lateness against schedule, p99 (ms)",
                sd["chunk_lateness_ms"]["p99"],
                sg["chunk_lateness_ms"]["p99"],
            ),
            "",
        ]
    )
