"""Long and large answers through the gateway, with real vLLM: a non-streamed generation
longer than the first-byte timeout is answered once by the tier asked for (the gateway
assembles it from the engine's stream), and a 1.8 MB answer arrives at the engine's speed.
That the assembled answer is vLLM's own JSON is tests/unit/test_assemble.py's, against
vLLM's response models."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.e2e.conftest import MODEL, VllmServer, engine_gateway_settings
from tests.fault.helpers import metric_value
from tests.servers import running_gateway
from tiergate.tiers import Tier

MESSAGES = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def impatient_gateway(vllm_servers: dict[Tier, VllmServer]) -> Iterator[str]:
    timeouts = {"first_byte_seconds": 0.5, "between_chunks_seconds": 30.0}
    settings = engine_gateway_settings(vllm_servers, timeouts=timeouts)
    with running_gateway(settings) as base:
        yield base


def test_generation_longer_than_the_first_byte_timeout_is_answered_once(
    impatient_gateway: str,
) -> None:
    body = {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": 200,
        "ignore_eos": True,
        "service_tier": "priority",
    }
    started = time.monotonic()
    resp = httpx.post(f"{impatient_gateway}/v1/chat/completions", json=body, timeout=300)
    took = time.monotonic() - started
    assert resp.status_code == 200, resp.text
    assert took > 0.5, took  # longer than the first-byte timeout: it was not cut
    assert resp.headers["x-tiergate-tier"] == "fast"
    assert "x-tiergate-fallback" not in resp.headers
    assert resp.json()["service_tier"] == "priority"
    assert resp.json()["usage"]["completion_tokens"] == 200
    assert metric_value(impatient_gateway, "tiergate_fallbacks_total") == 0
    assert metric_value(impatient_gateway, "tiergate_endpoint_ejections_total") == 0


def test_large_tokenize_answer_arrives_at_vllms_speed(
    gateway: str, vllm_servers: dict[Tier, VllmServer]
) -> None:
    body = {"model": MODEL, "prompt": "hello world " * 125_000}  # 1.5 MB
    started = time.monotonic()
    direct = httpx.post(f"{vllm_servers[Tier.STANDARD].url}/tokenize", json=body, timeout=120)
    direct_took = time.monotonic() - started
    started = time.monotonic()
    via = httpx.post(f"{gateway}/tokenize", json={**body, "service_tier": "default"}, timeout=120)
    took = time.monotonic() - started
    assert len(direct.content) > 1_000_000
    assert via.status_code == 200, via.text[:300]
    assert via.json() == direct.json()
    assert took < 2 * direct_took + 1.0, (took, direct_took)
    with ThreadPoolExecutor(10) as pool:
        statuses = list(
            pool.map(
                lambda _: httpx.post(f"{gateway}/tokenize", json=body, timeout=120).status_code,
                range(10),
            )
        )
    assert statuses == [200] * 10
    assert metric_value(gateway, "tiergate_endpoint_ejections_total") == 0
