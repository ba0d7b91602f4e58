"""Gateway overhead and throughput: direct, through vllm-router, through tiergate, in one run.

Each proxy runs pinned to core 0 (tiergate with ``--workers 2`` gets cores 0 and 1, which it
then shares with the load); the zero-cost backends (nginx for plain responses,
ZeroCostFakeBackend for streams) and the load generators share core 1. vllm-router (PyPI
``vllm-router``, Rust) is the reference proxy: absolute figures move between machines by
2x, so tiergate is judged by its ratio to it in the same run. Measured for every system:

1. saturation throughput with wrk (32 connections), non-streaming, in turns of about a
   second each, the systems in rotation;
2. latency at a fixed 60 requests/s (open loop), non-streaming: p50 and p99; the systems
   measured together, their requests interleaved (each its own 60 req/s);
3. one request at a time (keep-alive, 200 sequential requests): p50 and p99; for tiergate
   also its own ``x-tiergate-overhead-ms``, next to what the client sees it add;
4. streams of 20 chunks 10 ms apart: time to first chunk and how late each later chunk is.

Each other kind of measurement is taken of the systems back to back, their order rotated
from run to run, so that the proxies compared are measured seconds apart on a machine
whose speed moves within a minute. ``repeat`` runs the whole set that many times against the
same processes; the report gives each figure's median over the runs and every run's
figures, and flags a run whose direct saturation differs from the median by more than 15%
(the machine was busy).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tiergate.bench.gateway_report import DISTURBED_SPREAD, command_line, render_markdown, targets
from tiergate.bench.load import (
    FIXED_RATE,
    MODEL,
    SEQUENTIAL_REQUESTS,
    STREAM_CHUNKS,
    STREAM_GAP_MS,
    combined,
    fixed_rate,
    sequential,
    stream_lateness,
    summary,
    wrk,
)
from tiergate.bench.report import write_report
from tiergate.measure.fingerprint import cpu_kind
from tiergate.measure.ports import free_ports
from tiergate.measure.wait import wait_until

SATURATION_SLICES = 5
INSTALL_HINT = (
    "install the benchmark's tools: TIERGATE_BENCH_TOOLS=1 bash scripts/bootstrap.sh "
    "(or apt-get install -y nginx-light wrk; .venv/bin/pip install vllm-router)"
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


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _wait(url: str, budget: float = 30.0) -> None:
    if not wait_until(lambda: _answers(url), budget, 0.2):
        raise RuntimeError(f"{url} did not become ready")


def find_vllm_router() -> str:
    """The vllm-router executable (a benchmark tool, not a dependency of the gateway)."""
    beside = Path(sys.executable).parent / "vllm-router"
    found = str(beside) if beside.exists() else shutil.which("vllm-router")
    if found is None:
        raise SystemExit(f"the benchmark needs vllm-router (PyPI vllm-router): {INSTALL_HINT}")
    return found


def cpu_model() -> str:
    """The CPU every benchmark report names beside its figures: the model name with its
    family, model and vector instructions (:func:`~tiergate.measure.fingerprint.cpu_kind`),
    or lscpu's model name where /proc/cpuinfo has none (some ARM kernels)."""
    kind = cpu_kind()
    if not kind.startswith("unknown"):
        return kind
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return kind


class _Processes:
    """The backends and proxies a run starts; stopped (and their logs shown on failure) by
    the caller."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(
        self, name: str, cores: str, argv: list[str], env: dict[str, str] | None = None
    ) -> None:
        with (self.workdir / f"{name}.log").open("wb") as log:
            proc = subprocess.Popen(
                ["taskset", "-c", cores, *argv], env=env, stdout=log, stderr=subprocess.STDOUT
            )
        self.procs.append((name, proc))

    def report_failure(self) -> None:
        for name, proc in self.procs:
            path = self.workdir / f"{name}.log"
            tail = path.read_text(errors="replace")[-1500:] if path.exists() else ""
            _say(f"{name} (exit code {proc.poll()}) log ends with:\n{tail}")

    def stop(self) -> None:
        for _, proc in self.procs:
            proc.terminate()
        for _, proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _gateway_env(nginx_port: int, stream_port: int, port: int, metrics_port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "TIERGATE_TIERS": json.dumps(
                {
                    "standard": {"endpoints": [f"http://127.0.0.1:{nginx_port}"]},
                    "fast": {"endpoints": [f"http://127.0.0.1:{stream_port}"]},
                }
            ),
            "TIERGATE_GATEWAY__PORT": str(port),
            # Each gateway's /metrics listener apart: they run side by side.
            "TIERGATE_GATEWAY__METRICS_PORT": str(metrics_port),
        }
    )
    env.pop("TIERGATE_CONFIG", None)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    return env


def _measure(
    systems: Sequence[tuple[str, str, str]],
    duration: float,
    streams: int,
    workdir: Path,
    shift: int = 0,
) -> dict[str, dict[str, Any]]:
    """Every system's figures of one run, the systems in an order rotated by ``shift``:
    this shared machine's speed moves by 20% within a minute, and the proxies are compared
    with each other, so what is compared is measured close together. Saturation in turns
    of about a second, the systems in rotation; the fixed rate (the narrowest target) of
    all of them at once; one at a time and streams back to back, seconds apart."""
    order = [systems[(i + shift) % len(systems)] for i in range(len(systems))]
    found: dict[str, dict[str, Any]] = {name: {} for name, _, _ in systems}
    # A slow second of the machine then falls on every system alike, not on one.
    slices = max(1, min(SATURATION_SLICES, round(duration)))
    _say(f"  saturation (wrk, 32 connections): {slices} turns of {duration / slices:g}s each")
    sliced: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in order}
    for _ in range(slices):
        for name, plain, _ in order:
            sliced[name].append(wrk(plain, workdir, duration / slices))
    for name, _, _ in order:
        found[name]["saturation"] = sat = combined(sliced[name])
        _say(f"  {name}:   {sat['rps']:.0f} req/s")
    _say(f"  all at once, each at a fixed {FIXED_RATE:g} req/s for {duration:g}s")
    rated = asyncio.run(fixed_rate([plain for _, plain, _ in order], FIXED_RATE, duration))
    for (name, _, _), latencies in zip(order, rated, strict=True):
        found[name]["fixed_rate_ms"] = summary(latencies)
    for name, plain, _ in order:
        _say(f"  {name}: {SEQUENTIAL_REQUESTS} requests one at a time")
        seq = asyncio.run(sequential(plain, SEQUENTIAL_REQUESTS))
        found[name]["sequential_ms"] = summary(seq["latency_ms"])
        if seq["reported_overhead_ms"]:
            found[name]["reported_overhead_ms"] = summary(seq["reported_overhead_ms"])
    for name, _, stream in order:
        _say(f"  {name}: {streams} streams of {STREAM_CHUNKS} chunks {STREAM_GAP_MS:g} ms apart")
        st = asyncio.run(stream_lateness(stream, streams))
        found[name]["stream_ttfb_ms"] = summary(st["ttfb_ms"])
        found[name]["stream_chunk_lateness_ms"] = summary(st["chunk_lateness_ms"])
    return found


def _derive(run: dict[str, Any]) -> dict[str, Any]:
    """Added latency against direct for every proxy, and tiergate's ratios."""
    direct = run["direct"]
    derived: dict[str, Any] = {}
    for name, m in run.items():
        if name == "direct":
            continue
        added = {
            "fixed_rate_p50_ms": m["fixed_rate_ms"]["p50"] - direct["fixed_rate_ms"]["p50"],
            "fixed_rate_p99_ms": m["fixed_rate_ms"]["p99"] - direct["fixed_rate_ms"]["p99"],
            "sequential_p50_ms": m["sequential_ms"]["p50"] - direct["sequential_ms"]["p50"],
            "sequential_p99_ms": m["sequential_ms"]["p99"] - direct["sequential_ms"]["p99"],
            "stream_ttfb_p50_ms": m["stream_ttfb_ms"]["p50"] - direct["stream_ttfb_ms"]["p50"],
            "stream_lateness_p50_ms": m["stream_chunk_lateness_ms"]["p50"]
            - direct["stream_chunk_lateness_ms"]["p50"],
            "stream_lateness_p99_ms": m["stream_chunk_lateness_ms"]["p99"]
            - direct["stream_chunk_lateness_ms"]["p99"],
        }
        entry: dict[str, Any] = {
            "added": added,
            "saturation_vs_direct": m["saturation"]["rps"] / direct["saturation"]["rps"],
        }
        if name != "vllm-router":
            entry["saturation_vs_vllm_router"] = (
                m["saturation"]["rps"] / run["vllm-router"]["saturation"]["rps"]
            )
        if "reported_overhead_ms" in m:
            entry["reported_overhead_p50_ms"] = m["reported_overhead_ms"]["p50"]
            entry["client_added_p50_ms"] = added["sequential_p50_ms"]
        derived[name] = entry
    return derived


def _median_tree(trees: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Each numeric leaf's median over the runs (the trees have the same shape)."""
    out: dict[str, Any] = {}
    for key, value in trees[0].items():
        if isinstance(value, dict):
            out[key] = _median_tree([t[key] for t in trees])
        elif isinstance(value, int | float):
            out[key] = statistics.median(float(t[key]) for t in trees)
        else:
            out[key] = value
    return out


def _disturbed(runs: Sequence[dict[str, Any]]) -> list[int]:
    """Runs (1-based) whose direct saturation is off the median by more than 15%."""
    rates = [r["systems"]["direct"]["saturation"]["rps"] for r in runs]
    mid = statistics.median(rates)
    return [i + 1 for i, rps in enumerate(rates) if abs(rps - mid) > DISTURBED_SPREAD * mid]


def run_gateway_benchmark(
    out: Path,
    duration: float,
    *,
    repeat: int = 1,
    workers: Sequence[int] = (1,),
    streams: int | None = None,
    progress: Callable[[str], None] = _say,
) -> dict[str, Any]:
    """Run the side-by-side benchmark ``repeat`` times; write reports/gateway-bench.{md,json}
    and return the report (medians over the runs, and each run)."""
    for tool in ("nginx", "wrk", "taskset"):
        if shutil.which(tool) is None:
            raise SystemExit(f"the benchmark needs {tool}: {INSTALL_HINT}")
    router = find_vllm_router()
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("the benchmark pins the proxies and the load to separate cores")
    n_streams = streams if streams is not None else max(5, int(10 * duration))
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="tiergate-bench-"))
    ports = free_ports(6 + 2 * len(workers))
    nginx_port, stream_port, router_port, router_stream_port = ports[:4]
    router_metrics = ports[4:6]
    gateway_ports = dict(zip(workers, ports[6 : 6 + len(workers)], strict=True))
    gateway_metrics = dict(zip(workers, ports[6 + len(workers) :], strict=True))
    procs = _Processes(workdir)
    affinity = os.sched_getaffinity(0)
    runs: list[dict[str, Any]] = []
    cpu = cpu_model()
    try:
        progress(f"CPU: {cpu}; starting nginx and the streaming fake on core 1")
        conf = _nginx_conf(workdir, nginx_port)
        procs.start("nginx", "1", ["nginx", "-c", str(conf), "-p", str(workdir)])
        procs.start(
            "fake",
            "1",
            [
                sys.executable,
                "-m",
                "tiergate.bench.fake_backend",
                str(stream_port),
                str(STREAM_CHUNKS),
                str(STREAM_GAP_MS),
            ],
        )
        progress("starting vllm-router (one for nginx, one for the streaming fake) on core 0")
        for name, port, backend, metrics_port in (
            ("vllm-router", router_port, nginx_port, router_metrics[0]),
            ("vllm-router-stream", router_stream_port, stream_port, router_metrics[1]),
        ):
            procs.start(
                name,
                "0",
                [
                    router,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--worker-urls",
                    f"http://127.0.0.1:{backend}",
                    "--log-level",
                    "warning",
                    "--prometheus-host",
                    "127.0.0.1",
                    "--prometheus-port",
                    str(metrics_port),
                ],
            )
        for n, port in gateway_ports.items():
            cores = "0" if n == 1 else ",".join(str(c) for c in range(min(n, os.cpu_count() or 1)))
            progress(f"starting tiergate serve --workers {n} on core(s) {cores}")
            procs.start(
                f"tiergate-{n}",
                cores,
                [sys.executable, "-m", "tiergate", "serve", "--workers", str(n)]
                if n != 1
                else [sys.executable, "-m", "tiergate", "serve"],
                env=_gateway_env(nginx_port, stream_port, port, gateway_metrics[n]),
            )
        _wait(f"http://127.0.0.1:{nginx_port}/health")
        _wait(f"http://127.0.0.1:{stream_port}/health")
        _wait(f"http://127.0.0.1:{router_port}/health")
        _wait(f"http://127.0.0.1:{router_stream_port}/health")
        for port in gateway_ports.values():
            _wait(f"http://127.0.0.1:{port}/readyz")
        os.sched_setaffinity(0, {1})

        def url(port: int) -> str:
            return f"http://127.0.0.1:{port}/v1/chat/completions"

        systems: list[tuple[str, str, str]] = [
            ("direct", url(nginx_port), url(stream_port)),
            ("vllm-router", url(router_port), url(router_stream_port)),
        ]
        for n, port in gateway_ports.items():
            name = "tiergate" if n == 1 else f"tiergate-{n}proc"
            systems.append((name, url(port), url(port)))
        for i in range(repeat):
            progress(f"run {i + 1}/{repeat}")
            measured = _measure(systems, duration, n_streams, workdir, shift=i)
            derived = _derive(measured)
            verdict = targets(derived)
            runs.append({"systems": measured, "derived": derived, "targets": verdict})
            progress(
                f"run {i + 1}: "
                + "; ".join(
                    f"{name} {t['value']:.3f} ({'met' if t['met'] else 'missed'})"
                    for name, t in verdict.items()
                )
            )
    except BaseException:
        procs.report_failure()
        raise
    finally:
        procs.stop()
        os.sched_setaffinity(0, affinity)
        shutil.rmtree(workdir, ignore_errors=True)
    report: dict[str, Any] = {
        "cpu_model": cpu,
        "cores": os.cpu_count(),
        "duration_s": duration,
        "repeat": repeat,
        "workers": list(workers),
        "streams": n_streams,
        "fixed_rate_rps": FIXED_RATE,
        "command": command_line(duration, repeat, workers),
        "median": _median_tree([{"systems": r["systems"], "derived": r["derived"]} for r in runs]),
        "disturbed_runs": _disturbed(runs),
        "runs": runs,
    }
    write_report(out, "gateway-bench", report, render_markdown(report))
    return report
