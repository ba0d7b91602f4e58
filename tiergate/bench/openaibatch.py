"""``tiergate bench batch``: OpenAI's Batch API on a running stack (``tiergate up``), in one
run, against vLLM's own offline ``run-batch`` and against the stack at rest.

1. **Idle**: after a warm-up whose figures are thrown away, ``probes`` interactive
   streamed chat requests (no ``service_tier``: the default
   tier), one after another: TTFT and TPOT (tiergate.measure.stream's samples).
2. **The batch**: ``lines`` chat requests uploaded and run as one batch with the official
   ``openai`` client, as OpenAI's Batch API guide does. A thread polls the batch every
   second; meanwhile interactive requests go one after another as in 1, and those that
   ended while the batch was still running are its "busy" samples. The batch's output
   tokens/s is its ``usage.output_tokens`` over the seconds from create to the poll that saw
   it final.
3. **vLLM's run-batch** (``vllm.entrypoints.openai.run_batch``) on the same lines with the
   standard tier's engine configuration (model, dtype, context, eager or compiled, chat
   template, KV cache, cores): output tokens/s from its output file's usage over the
   seconds from its "Reading batch" line (the engine is loaded) to its output file's last
   write (its engine's shutdown left out, as the engine's start is).

Every line asks for exactly ``max_tokens`` tokens (``min_tokens`` too), so both runs
produce the same work whatever the model says. The ratios (batch / run-batch; busy / idle
TTFT and TPOT) come from one run on one machine; the goals (at least 0.8x; at most 1.5x)
are reported, not asserted.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from tiergate.engine.command import vllm_environment
from tiergate.engine.families import tool_support
from tiergate.enginesettings import TierProfile
from tiergate.measure.fingerprint import hardware_fingerprint
from tiergate.measure.stream import Sample, chat_body, timed
from tiergate.speculative.measure import PROMPTS

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BatchBenchParams:
    gateway: str
    api_key: str
    lines: int = 2000
    max_tokens: int = 32
    probes: int = 8
    probe_tokens: int = 64
    model: str | None = None
    baseline: bool = True  # run vLLM's run-batch (minutes: its engine loads, maybe compiles)
    timeout_seconds: float = 3600.0
    # The gateway's /metrics, where the patient lane's limit is read while the batch runs.
    metrics_url: str | None = None


def batch_rows(model: str, count: int, max_tokens: int) -> list[dict[str, Any]]:
    """The batch's input lines: natural prompts in turn, each answer exactly
    ``max_tokens`` long, greedy."""
    return [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": model,
                "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                "max_tokens": max_tokens,
                "min_tokens": max_tokens,
                "temperature": 0,
            },
        }
        for i in range(count)
    ]


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(row).encode() + b"\n" for row in rows)


def latency(samples: list[Sample]) -> dict[str, float]:
    tpots = [s.tpot for s in samples if s.tpot]
    return {
        "requests": len(samples),
        "ttft_p50_ms": statistics.median(s.ttft for s in samples) * 1000 if samples else 0.0,
        "tpot_p50_ms": statistics.median(tpots) * 1000 if tpots else 0.0,
    }


class _Prober:
    """Interactive streamed requests through the gateway, one at a time."""

    def __init__(self, params: BatchBenchParams, model: str) -> None:
        self._url = params.gateway.rstrip("/") + "/v1/chat/completions"
        self._headers = {"authorization": f"Bearer {params.api_key}"}
        self._model = model
        self._tokens = params.probe_tokens

    def run(self, count: int | None, until: Callable[[], bool] = lambda: False) -> list[Sample]:
        """``count`` requests, or as many as end before ``until()`` holds."""

        async def go() -> list[Sample]:
            samples: list[Sample] = []
            async with httpx.AsyncClient(timeout=600, headers=self._headers) as client:
                i = 0
                while (count is None or i < count) and not until():
                    body = chat_body(self._model, PROMPTS[i % len(PROMPTS)], self._tokens, None)
                    sample = await timed(client, self._url, body)
                    if count is not None or not until():
                        samples.append(sample)
                    i += 1
            return samples

        return asyncio.run(go())

    def warm(self, burst: int) -> None:
        """Requests whose figures are thrown away, so that "idle" is not an engine's first
        requests (slower while it warms: twice the TPOT seen once on a compiled engine):
        two bursts of ``burst`` at once as ``flex`` (patient: the batch's shapes, and no
        sample for the gateway's patient-lane reference), then four one at a time."""

        async def go() -> None:
            async with httpx.AsyncClient(timeout=600, headers=self._headers) as client:
                for _ in range(2):
                    await asyncio.gather(
                        *(
                            timed(client, self._url, chat_body(self._model, p, 16, "flex"))
                            for p in (PROMPTS * burst)[:burst]
                        )
                    )
                for prompt in PROMPTS[:4]:
                    await timed(client, self._url, chat_body(self._model, prompt, 16, None))

        asyncio.run(go())


def run_through_tiergate(
    params: BatchBenchParams, rows: list[dict[str, Any]], prober: _Prober, progress: Progress
) -> dict[str, Any]:
    """Upload, create, probe while it runs, and read the final batch (the official client)."""
    import openai

    client = openai.OpenAI(base_url=params.gateway.rstrip("/") + "/v1", api_key=params.api_key)
    upload = client.files.create(file=("bench.jsonl", io.BytesIO(jsonl(rows))), purpose="batch")
    started = time.monotonic()
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    if batch.status != "in_progress":
        raise RuntimeError(f"the batch was not accepted: {batch.status} {batch.errors}")
    final: dict[str, Any] = {}
    ended = threading.Event()
    limits: list[float] = []

    def poll() -> None:
        last_said = 0.0
        deadline = started + params.timeout_seconds
        while time.monotonic() < deadline:
            limit = lane_limit(params.metrics_url)
            if limit is not None:
                limits.append(limit)
            got = client.batches.retrieve(batch.id)
            if got.status in ("completed", "failed", "expired", "cancelled"):
                final.update(batch=got, seconds=time.monotonic() - started)
                break
            if time.monotonic() - last_said > 15 and got.request_counts is not None:
                last_said = time.monotonic()
                counts = got.request_counts
                progress(f"batch {counts.completed + counts.failed}/{counts.total} lines")
            time.sleep(1.0)
        ended.set()

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    busy = prober.run(None, ended.is_set)
    poller.join()
    got = final.get("batch")
    if got is None:
        raise RuntimeError(f"the batch did not end within {params.timeout_seconds:g} s")
    usage = got.usage
    output_tokens = usage.output_tokens if usage is not None else 0
    counts = got.request_counts
    return {
        "batch_id": got.id,
        "status": got.status,
        "completed": counts.completed if counts else 0,
        "failed": counts.failed if counts else 0,
        "seconds": final["seconds"],
        "output_tokens": output_tokens,
        "output_tokens_per_s": output_tokens / final["seconds"],
        "busy": latency(busy),
        "patient_lane_limit": (
            {"median": statistics.median(limits), "min": min(limits), "max": max(limits)}
            if limits
            else None
        ),
    }


def lane_limit(metrics_url: str | None) -> float | None:
    """The standard tier's patient-lane limit on the gateway's /metrics (None unread)."""
    if metrics_url is None:
        return None
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = httpx.get(metrics_url, timeout=5).text
    except httpx.HTTPError:
        return None
    for family in text_string_to_metric_families(text):
        if family.name == "tiergate_patient_lane_limit":
            for sample in family.samples:
                if sample.labels.get("tier") == "standard":
                    return float(sample.value)
    return None


def run_batch_command(profile: TierProfile, source: Path, target: Path) -> list[str]:
    """vLLM's offline batch runner with the standard tier's engine configuration."""
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(source)]
    cmd += ["-o", str(target), "--model", profile.model]
    cmd += ["--served-model-name", profile.served_model_name, "--dtype", profile.dtype]
    if profile.max_model_len is not None:
        cmd += ["--max-model-len", str(profile.max_model_len)]
    if profile.enforce_eager:
        cmd.append("--enforce-eager")
    family = tool_support(profile.served_model_name, profile.model)
    template = family.chat_template if profile.chat_template == "auto" else profile.chat_template
    if template:  # the one the tier's engine is given (tiergate.engine.command)
        cmd += ["--chat-template", template]
    return cmd + list(profile.extra_args)


def run_vllm_batch(
    profile: TierProfile, rows: list[dict[str, Any]], workdir: Path, progress: Progress
) -> dict[str, Any]:
    source, target, log = workdir / "input.jsonl", workdir / "output.jsonl", workdir / "run.log"
    source.write_bytes(jsonl(rows))
    cmd = run_batch_command(profile, source, target)
    progress(f"vLLM run-batch: {' '.join(cmd[1:6])} ... (log: {log})")
    reading: float | None = None
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd,
            env={**vllm_environment(profile), "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        assert proc.stdout is not None
        for raw in proc.stdout:
            out.write(raw)
            if reading is None and b"Reading batch from" in raw:
                reading = time.time()  # wall clock, as the output file's mtime is
                progress("run-batch: engine loaded, batch started")
        code = proc.wait()
    if code != 0 or reading is None or not target.is_file():
        raise RuntimeError(f"vLLM run-batch failed (exit {code}); see {log}")
    ended = target.stat().st_mtime
    answers = [json.loads(line) for line in target.read_text().splitlines() if line]
    tokens = sum(
        ((a.get("response") or {}).get("body") or {}).get("usage", {}).get("completion_tokens", 0)
        for a in answers
    )
    ok = sum(1 for a in answers if (a.get("response") or {}).get("status_code") == 200)
    seconds = ended - reading
    return {
        "completed": ok,
        "failed": len(answers) - ok,
        "seconds": seconds,
        "output_tokens": tokens,
        "output_tokens_per_s": tokens / seconds,
    }


def bench_batch(
    params: BatchBenchParams,
    profile: TierProfile,
    workdir: Path,
    progress: Progress,
    gpu: str = "none",
    lane: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The three parts above; ``lane``: the stack's batch settings, for the report."""
    headers = {"authorization": f"Bearer {params.api_key}"}
    models = httpx.get(f"{params.gateway.rstrip('/')}/v1/models", headers=headers, timeout=30)
    models.raise_for_status()
    model = params.model or models.json()["data"][0]["id"]
    rows = batch_rows(model, params.lines, params.max_tokens)
    prober = _Prober(params, model)
    progress("warming the engines (figures thrown away)")
    prober.warm(32)
    progress(f"idle: {params.probes} interactive requests, one at a time")
    idle = latency(prober.run(params.probes))
    progress(f"the batch: {params.lines} lines of {params.max_tokens} tokens through tiergate")
    tiergate = run_through_tiergate(params, rows, prober, progress)
    baseline = None
    if params.baseline:
        workdir.mkdir(parents=True, exist_ok=True)
        baseline = run_vllm_batch(profile, rows, workdir, progress)
    busy = tiergate["busy"]
    return {
        "params": asdict(params) | {"api_key": "(not recorded)", "model": model},
        "hardware": hardware_fingerprint(gpu),
        "cpu_count": os.cpu_count(),
        "lane": lane or {},
        "idle": idle,
        "tiergate": tiergate,
        "run_batch": baseline,
        "ratios": {
            "batch_vs_run_batch": (
                tiergate["output_tokens_per_s"] / baseline["output_tokens_per_s"]
                if baseline
                else None
            ),
            "ttft_busy_vs_idle": _ratio(busy["ttft_p50_ms"], idle["ttft_p50_ms"]),
            "tpot_busy_vs_idle": _ratio(busy["tpot_p50_ms"], idle["tpot_p50_ms"]),
        },
    }


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None
