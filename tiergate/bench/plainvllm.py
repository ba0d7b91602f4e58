"""A plain ``vllm serve`` of the standard tier's model, as a user would start it, for
``tiergate bench tiers --plain-vllm start``: vLLM's own defaults (compiled, the model's
context length, first-come scheduling, no tool parser or chat template), with only what
vLLM's CPU install guide sets for every CPU server (its KV-cache size, thread binding and
allocators) taken from the standard tier's profile, so that it runs on the same cores with
the same memory. It is what the tiers are compared against, in the same run."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from tiergate.engine.command import vllm_environment
from tiergate.engine.process import Engine, mark_start, stop_process_group, wait_ready
from tiergate.enginesettings import TierProfile


def plain_command(profile: TierProfile, port: int, python: str = sys.executable) -> list[str]:
    return [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        profile.model,
        "--served-model-name",
        profile.served_model_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]


@contextlib.contextmanager
def plain_vllm(
    profile: TierProfile, port: int, log: Path, progress: Callable[[str], None]
) -> Iterator[str]:
    """Start it, wait until it answers (its first start compiles: minutes), yield its URL,
    stop it."""
    started = time.monotonic()
    with log.open("ab") as out:
        mark_start(out, plain_command(profile, port))
        proc = subprocess.Popen(
            plain_command(profile, port),
            env=vllm_environment(profile),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    engine = Engine("plain vllm", f"http://127.0.0.1:{port}", profile.served_model_name, proc, log)
    try:
        progress(f"started a plain vllm serve on port {port} (log: {log}); it compiles first")
        wait_ready([engine], budget=1800.0, progress=progress)
        progress(f"plain vllm serve ready after {time.monotonic() - started:.0f} s")
        yield engine.url
    finally:
        stop_process_group(proc)
