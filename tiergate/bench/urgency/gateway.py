"""The urgency benchmark's own gateway: its settings, serving it in a thread for the run,
and the check that the engines schedule by priority.

The gateway is the local stack's when the tuner decides "equal": every engine in both
tiers' pools (the fast tier's in the reverse order, as ``tiergate.fastfit.shared_pools``
lists them) and each upstream request carrying vLLM's ``priority``. Unlike the stack's, the
standard tier admits only ``capacity`` requests at once, so that a backlog forms in the
gateway's admission queue, and nothing waits long enough to time out.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn

from tiergate.gateway.app import create_app
from tiergate.gateway.serving import uvicorn_options
from tiergate.measure.wait import wait_until
from tiergate.settings import Settings, load_settings

PATIENT_SECONDS = 600.0


class UrgencyBenchError(RuntimeError):
    """The benchmark cannot run as asked (an engine that does not answer, or one that does
    not schedule by priority); the message says what to change."""


def bench_settings(engines: list[str], capacity: int, queue: int, port: int) -> Settings:
    """The gateway's settings for the run: auth off, jobs off, no second listener (its
    /metrics on the serving port), every engine in both pools, engine priorities on, the
    standard tier admitting ``capacity`` at once with room for ``queue`` more."""
    tree: dict[str, Any] = {
        "gateway": {
            "host": "127.0.0.1",
            "port": port,
            "log_requests": False,
            "metrics_port": None,
            "metrics_on_serving_port": True,
            "tier_evidence_file": None,
        },
        "tiers": {
            "standard": {"endpoints": list(engines)},
            "fast": {"endpoints": list(reversed(engines))},
        },
        "policy": {"engine_priorities": True},
        "auth": {"enabled": False},
        "jobs": {"enabled": False},
        "admission": {
            "tiers": {
                "standard": {"max_concurrent": capacity, "max_queue": max(256, 2 * queue)},
                "fast": {"max_concurrent": 64, "max_queue": 256},
            },
            "queue_timeout_seconds": PATIENT_SECONDS,
        },
        "timeouts": {
            "first_byte_seconds": PATIENT_SECONDS,
            "between_chunks_seconds": PATIENT_SECONDS,
            "client_write_seconds": PATIENT_SECONDS,
        },
    }
    return load_settings(**tree)


@contextmanager
def gateway_in_thread(settings: Settings) -> Iterator[str]:
    """Serve the gateway with uvicorn in a background thread for the block; its base URL."""
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings),
            host=settings.gateway.host,
            port=settings.gateway.port,
            lifespan="on",
            **uvicorn_options(settings.gateway),
        )
    )
    thread = threading.Thread(target=server.run, name="bench-gateway", daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), 30, 0.02)
    if not server.started:
        server.should_exit = True
        raise UrgencyBenchError("the benchmark's gateway did not start")
    try:
        yield f"http://{settings.gateway.host}:{settings.gateway.port}"
    finally:
        server.should_exit = True
        thread.join(30)


def check_priority_scheduling(engine: str, model: str) -> None:
    """Ask ``engine`` for one token with vLLM's ``priority: 1``: an engine started without
    ``--scheduling-policy priority`` refuses it (400), and would refuse every request the
    gateway sends it with engine priorities on."""
    body = {
        "model": model,
        "max_tokens": 1,
        "priority": 1,
        "messages": [{"role": "user", "content": "Say hello"}],
    }
    try:
        resp = httpx.post(f"{engine}/v1/chat/completions", json=body, timeout=120)
    except httpx.HTTPError as exc:
        raise UrgencyBenchError(f"engine {engine} does not answer ({exc}); is it running?") from exc
    if resp.status_code == 200:
        return
    if resp.status_code == 400 and "priority" in resp.text.lower():
        raise UrgencyBenchError(
            f"engine {engine} does not schedule by priority ({resp.text.strip()[:200]}): "
            "start it with --scheduling-policy priority (the local stack, `tiergate up`, "
            "does)"
        )
    raise UrgencyBenchError(
        f"engine {engine} answered {resp.status_code} to a one-token chat completion for "
        f"model {model!r}: {resp.text.strip()[:200]}"
    )
