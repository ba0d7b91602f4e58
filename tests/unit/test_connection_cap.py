"""The serving port's connection cap (gateway.max_connections, uvicorn's
limit_concurrency): a real uvicorn server on loopback with the gateway's options, and raw
sockets. Past the cap a request is answered 503 and its connection closed; the held
connections, once closed, make room again."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from tests.servers import serving_app
from tests.waiting import eventually
from tiergate.settings import load_settings

CAP = 3
REQUEST = b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await receive()
    headers = [(b"content-type", b"text/plain"), (b"content-length", b"2")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def server() -> Iterator[tuple[int, uvicorn.Server]]:
    gateway = load_settings(gateway={"max_connections": CAP, "keep_alive_seconds": 30}).gateway
    with serving_app(_app, gateway) as running:
        yield running


def _status(sock: socket.socket) -> bytes:
    sock.sendall(REQUEST)
    sock.settimeout(10)
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(65536)
        if not chunk:
            break
        answer += chunk
    return answer.split(b"\r\n", 1)[0]


def test_past_the_cap_a_request_gets_503_and_room_comes_back(
    server: tuple[int, uvicorn.Server],
) -> None:
    port, running = server
    held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(CAP)]
    try:
        # The server has accepted every held connection (they count from then on).
        eventually(
            lambda: len(running.server_state.connections) >= CAP, 10, 0.02, "connections held"
        )
        with socket.create_connection(("127.0.0.1", port), timeout=5) as extra:
            assert _status(extra) == b"HTTP/1.1 503 Service Unavailable"
    finally:
        for sock in held:
            sock.close()
    eventually(lambda: len(running.server_state.connections) == 0, 10, 0.02, "the held ones closed")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as again:
        assert _status(again) == b"HTTP/1.1 200 OK"
