"""Running a real gateway (uvicorn on loopback, in a thread) for tests."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from tests.waiting import eventually
from tiergate.fitting import Fitting
from tiergate.gateway.app import create_app
from tiergate.gateway.serving import uvicorn_options
from tiergate.measure.ports import free_port as free_port
from tiergate.settings import Settings, load_settings


def gateway_settings(standard: list[str], fast: list[str], **overrides: Any) -> Settings:
    """Settings for a test gateway: quick health checks and a short ejection cool-down, and
    /metrics on the serving port (opted in, no second listener), so that tests read it where
    they send requests and gateways side by side need no port each; tests/fault/
    test_exposure.py covers the default (its own port only)."""
    tree: dict[str, Any] = {
        "tiers": {"standard": {"endpoints": standard}, "fast": {"endpoints": fast}},
        "health": {
            "interval_seconds": 0.2,
            "timeout_seconds": 1.0,
            "eject_after_failures": 1,
            "cooldown_seconds": 30,
        },
        "timeouts": {
            "connect_seconds": 1.0,
            "first_byte_seconds": 10.0,
            "between_chunks_seconds": 5.0,
        },
        "gateway": {"log_requests": False, "metrics_port": None, "metrics_on_serving_port": True},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(tree.get(key), dict):
            tree[key] = {**tree[key], **value}
        else:
            tree[key] = value
    return load_settings(**tree)


@contextmanager
def running_gateway(
    settings: Settings, port: int | None = None, fitting: Fitting | None = None
) -> Iterator[str]:
    """Serve the gateway on a (free) loopback port for the duration of the block
    (``fitting``: a fast tier that joins later, as the local stack's does)."""
    port = port or free_port()
    config = uvicorn.Config(
        create_app(settings, fitting),
        host="127.0.0.1",
        port=port,
        lifespan="on",
        **uvicorn_options(settings.gateway),
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    eventually(
        lambda: server.started or not thread.is_alive(), 20, 0.02, "the test gateway started"
    )
    if not server.started:
        raise RuntimeError("the test gateway did not start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@contextmanager
def serving_app(app: Any, gateway: Any) -> Iterator[tuple[int, uvicorn.Server]]:
    """``app`` (any ASGI app) on a free loopback port, with the gateway's uvicorn options
    for ``gateway`` (GatewaySettings), in a thread: the port and the server."""
    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, lifespan="off", **uvicorn_options(gateway)
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    eventually(lambda: server.started or not thread.is_alive(), 20, 0.02, "the server started")
    assert server.started
    try:
        yield port, server
    finally:
        server.should_exit = True
        thread.join(10)
