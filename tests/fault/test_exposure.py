"""What an exposed gateway shows and how long it waits: /metrics on its own port, docs off,
readiness independent of the tiers, the body read deadline, and which models errors name."""

from __future__ import annotations

import socket
import time
from typing import Any
from urllib.parse import urlsplit

import httpx

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.servers import free_port, gateway_settings, running_gateway
from tiergate.gateway.access.auth import new_key
from tiergate.settings import GatewaySettings

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


def _port(base: str) -> int:
    port = urlsplit(base).port
    assert port is not None
    return port


def test_metrics_only_on_the_metrics_port_by_default(fakes: list[FakeVllm]) -> None:
    default = GatewaySettings()
    assert default.metrics_port is not None and not default.metrics_on_serving_port
    metrics_port = free_port()  # the default's port, 9300, may be taken on a test machine
    settings = gateway_settings(
        [fakes[0].url],
        [fakes[2].url],
        gateway={
            "metrics_port": metrics_port,
            "metrics_on_serving_port": default.metrics_on_serving_port,
        },
    )
    with running_gateway(settings) as base:
        assert httpx.post(f"{base}/v1/chat/completions", json=CHAT).status_code == 200
        main = httpx.get(f"{base}/metrics")
        assert main.status_code == 404 and main.json()["error"]["code"] == "not_found"
        scraped = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics")
        assert scraped.status_code == 200
        assert scraped.headers["content-type"].startswith("text/plain")
        assert "tiergate_requests_total{" in scraped.text
        assert "tiergate_endpoint_healthy{" in scraped.text
        assert httpx.get(f"http://127.0.0.1:{metrics_port}/docs").status_code == 404
    # The second listener ends with the gateway.
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", metrics_port)) != 0


def test_docs_off_serves_no_description(fakes: list[FakeVllm]) -> None:
    settings = gateway_settings([fakes[0].url], [fakes[2].url], gateway={"docs": False})
    with running_gateway(settings) as base:
        for path in ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"):
            resp = httpx.get(f"{base}{path}")
            assert resp.status_code == 404, path
            assert resp.json()["error"]["code"] == "not_found"
        assert httpx.post(f"{base}/v1/chat/completions", json=CHAT).status_code == 200
        # Opted in (tests.servers.gateway_settings): /metrics on the serving port.
        assert httpx.get(f"{base}/metrics").status_code == 200


def test_ready_while_every_tier_is_down() -> None:
    dead = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    with running_gateway(gateway_settings([dead[0]], [dead[1]])) as base:
        ready = httpx.get(f"{base}/readyz")
        assert ready.status_code == 200
        assert ready.json() == {
            "ready": True,
            "tiers_serving": False,
            "tiers": {"standard": False, "fast": False},
        }
        # Its own routes answer: models (empty), and completions refused with retry-after.
        assert httpx.get(f"{base}/v1/models").json()["data"] == []
        refused = httpx.post(f"{base}/v1/chat/completions", json=CHAT)
        assert refused.status_code == 503 and "retry-after" in refused.headers


def _raw_post(
    port: int, head_extra: bytes, parts: list[tuple[float, bytes]]
) -> tuple[bytes, float]:
    """POST a chat body over a raw socket, sending ``parts`` after their delays; returns
    everything read until the server closes, and the seconds since the headers went out."""
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\n"
            b"content-type: application/json\r\nconnection: close\r\n" + head_extra + b"\r\n"
        )
        start = time.monotonic()
        for delay, data in parts:
            time.sleep(delay)
            sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        return received, time.monotonic() - start


def test_stalled_body_gets_408_within_the_timeout(fakes: list[FakeVllm]) -> None:
    settings = gateway_settings(
        [fakes[0].url], [fakes[2].url], gateway={"body_read_timeout_seconds": 1.0}
    )
    body = b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}'
    with running_gateway(settings) as base:
        port = _port(base)
        # Headers promise 100 bytes; 10 arrive, then nothing.
        answer, took = _raw_post(port, b"content-length: 100\r\n", [(0.0, body[:10])])
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b'"code":"request_timeout"' in answer and b"timeout_error" in answer
        assert 0.9 <= took < 3.0, took
        # A body that arrives in parts within the deadline is served.
        length = f"content-length: {len(body)}\r\n".encode()
        answer, _ = _raw_post(port, length, [(0.0, body[:10]), (0.4, body[10:])])
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        # Once the body is in, answers may take longer than the deadline, streamed or not.
        fakes[0].behaviour.chunk_delay = 1.5
        slow = httpx.post(f"{base}/v1/chat/completions", json=CHAT, timeout=10)
        assert slow.status_code == 200
        fakes[0].behaviour.chunk_delay = 0.4  # five chunks: 1.6 s
        streamed = httpx.post(
            f"{base}/v1/chat/completions", json={**CHAT, "stream": True}, timeout=10
        )
        assert streamed.status_code == 200 and streamed.text.endswith("data: [DONE]\n\n")
        assert fakes[0].record.cancelled == 0
    assert fakes[0].record.requests == 3


def test_errors_name_only_models_the_key_may_use() -> None:
    public, secret = FakeVllm(MODEL).start(), FakeVllm("secret-model").start()
    key, digest = new_key()
    auth: dict[str, Any] = {
        "enabled": True,
        "keys": [{"name": "app", "hash": digest, "models": [MODEL]}],
    }
    try:
        settings = gateway_settings([public.url], [secret.url], auth=auth)
        with running_gateway(settings) as base:
            headers = {"authorization": f"Bearer {key}"}
            url = f"{base}/v1/chat/completions"
            unknown = httpx.post(url, json={**CHAT, "model": "nope"}, headers=headers)
            assert unknown.status_code == 404
            message = unknown.json()["error"]["message"]
            assert MODEL in message and "secret-model" not in message
            denied = httpx.post(url, json={**CHAT, "model": "secret-model"}, headers=headers)
            assert denied.status_code == 403
            assert denied.json()["error"]["code"] == "model_not_allowed"
            assert MODEL not in denied.json()["error"]["message"]
            models = httpx.get(f"{base}/v1/models", headers=headers).json()["data"]
            assert [m["id"] for m in models] == [MODEL]
            # The description is served without a key: it names no served model then.
            schema = httpx.get(f"{base}/openapi.json").text
            assert "secret-model" not in schema and MODEL not in schema
    finally:
        public.stop()
        secret.stop()
