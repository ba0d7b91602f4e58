"""The README's request log: JSON, one line per request, with the request id (the one in
``x-tiergate-request-id``), the client's own id, the tiers asked and served, the engine,
attempts, status, latency, TTFT, TPOT and the gateway's overhead. A real gateway over
FakeVllm (a fake engine, named as one), its standard error read as a log shipper would."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.servers import gateway_settings, running_gateway


def test_each_request_is_one_json_line_with_what_the_readme_lists(
    fakes: list[FakeVllm], capfd: pytest.CaptureFixture[str]
) -> None:
    settings = gateway_settings(
        [fakes[0].url], [fakes[2].url], gateway={"log_requests": True, "metrics_port": None}
    )
    mine = [f"client-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with running_gateway(settings) as base:
        plain = httpx.post(
            f"{base}/v1/chat/completions",
            json={**body, "service_tier": "priority"},
            headers={"x-request-id": mine[0]},
        )
        with httpx.stream(
            "POST",
            f"{base}/v1/chat/completions",
            json={**body, "stream": True},
            headers={"x-request-id": mine[1]},
        ) as streamed:
            streamed.read()
        assert plain.status_code == streamed.status_code == 200
    err = capfd.readouterr().err
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    access = {
        line.get("client_request_id"): line for line in lines if line["logger"] == "tiergate.access"
    }
    assert set(mine) <= set(access), err[-2000:]
    first, second = access[mine[0]], access[mine[1]]
    # One line per request: each client id once.
    assert [line.get("client_request_id") for line in lines].count(mine[0]) == 1
    assert first["request_id"] == plain.headers["x-tiergate-request-id"]
    assert (first["tier_requested"], first["tier"]) == ("fast", "fast")
    assert first["endpoint"] == fakes[2].url and first["attempts"] == 1
    assert (first["status"], first["path"], first["model"]) == (200, "/v1/chat/completions", MODEL)
    for field in ("latency_ms", "overhead_ms", "ts"):
        assert field in first, first
    assert second["stream"] is True and second["tier"] == "standard"
    for field in ("ttft_ms", "tpot_ms", "latency_ms"):
        assert isinstance(second[field], int | float), second
