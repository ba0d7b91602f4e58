"""A non-streamed generation longer than the first-byte timeout, with FakeVllm: the gateway
asks the engine for a stream and holds it to liveness (first byte, gap between chunks), so
the answer comes once, from the tier asked for."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.fault.helpers import metric_value
from tests.servers import gateway_settings, running_gateway

PROMPT = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"model": MODEL, "messages": PROMPT}),
        ("/v1/completions", {"model": MODEL, "prompt": "hi"}),
    ],
)
def test_long_generation_is_answered_once_by_the_tier_asked(
    fakes: list[FakeVllm], path: str, body: dict[str, object]
) -> None:
    fast = fakes[2]
    fast.behaviour.chunks = 8
    fast.behaviour.chunk_delay = 0.2  # 1.4 s of generation, a chunk every 0.2 s
    settings = gateway_settings(
        [fakes[0].url],
        [fast.url],
        timeouts={"first_byte_seconds": 0.5, "between_chunks_seconds": 0.5},
    )
    with running_gateway(settings) as base:
        started = time.monotonic()
        resp = httpx.post(f"{base}{path}", json={**body, "service_tier": "priority"}, timeout=10)
        took = time.monotonic() - started
        assert resp.status_code == 200, resp.text
        assert took >= 1.4
        assert resp.headers["x-tiergate-tier"] == "fast"
        assert "x-tiergate-fallback" not in resp.headers
        answer = resp.json()
        assert answer["service_tier"] == "priority"
        choice = answer["choices"][0]
        text = choice["message"]["content"] if "messages" in body else choice["text"]
        assert text == "".join(f"tok{i} " for i in range(8))
        assert choice["finish_reason"] == "stop"
        assert answer["usage"] == {
            "prompt_tokens": 3,
            "total_tokens": 11,
            "completion_tokens": 8,
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        }
        assert fast.record.requests == 1 and fakes[0].record.requests == 0
        assert fast.record.bodies[0]["stream"] is True
        assert metric_value(base, "tiergate_fallbacks_total") == 0
        assert metric_value(base, "tiergate_endpoint_ejections_total") == 0


def test_engine_that_stops_generating_is_a_timeout_not_a_second_generation(
    fakes: list[FakeVllm],
) -> None:
    fakes[0].behaviour.mode = "stall_stream"
    settings = gateway_settings(
        [fakes[0].url], [fakes[2].url], timeouts={"between_chunks_seconds": 0.5}
    )
    with running_gateway(settings) as base:
        resp = httpx.post(f"{base}/v1/chat/completions", json={"model": MODEL, "messages": PROMPT})
        assert resp.status_code == 504
        assert resp.json()["error"]["code"] == "upstream_timeout"
        assert fakes[2].record.requests == 0  # started on the standard tier: no fallback
