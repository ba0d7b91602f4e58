"""Long and large answers through the gateway, with real vLLM: a non-streamed generation
longer than the first-byte timeout is answered once by the tier asked for (the gateway
assembles it from the engine's stream), and a 1.8 MB answer arrives whole, byte for byte.
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
from tests.waiting import eventually
from tiergate.backends.loadstats import parse_load_signals
from tiergate.tiers import Tier

MESSAGES = [{"role": "user", "content": "Name three colours."}]


FIRST_BYTE_SECONDS = 2.0  # far above an idle engine's first token (tens of ms), below the answer


def engine_idle(url: str) -> bool:
    """No request running or waiting on the engine at ``url`` (read from vLLM's metrics):
    an earlier test's leftovers would add their time to this test's first token."""
    signals = parse_load_signals(httpx.get(f"{url}/metrics", timeout=10).text)
    return signals.running == 0 and signals.waiting == 0


def tokens_lasting(url: str, seconds: float) -> int:
    """How many tokens the engine at ``url`` takes about ``seconds`` to generate for
    MESSAGES, from one timed streamed answer (processors differ about 2x: never a constant)."""
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 64, "ignore_eos": True}
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=120
    ) as resp:
        first = None
        for line in resp.iter_lines():
            if first is None and line.startswith("data:"):
                first = time.monotonic()
        per_token = (time.monotonic() - (first or time.monotonic())) / 63
    return min(1800, max(64, int(seconds / max(per_token, 1e-3))))


@pytest.fixture
def impatient_gateway(vllm_servers: dict[Tier, VllmServer]) -> Iterator[str]:
    timeouts = {"first_byte_seconds": FIRST_BYTE_SECONDS, "between_chunks_seconds": 30.0}
    settings = engine_gateway_settings(vllm_servers, timeouts=timeouts)
    with running_gateway(settings) as base:
        yield base


def test_generation_longer_than_the_first_byte_timeout_is_answered_once(
    impatient_gateway: str, vllm_servers: dict[Tier, VllmServer]
) -> None:
    fast = vllm_servers[Tier.FAST].url
    eventually(lambda: engine_idle(fast), 120, 0.5, "the fast engine idle")
    # An answer lasting about five first-byte timeouts on this machine (ngram speculation
    # may speed its later, repetitive tokens up: the margin covers that).
    tokens = tokens_lasting(fast, 5 * FIRST_BYTE_SECONDS)
    body = {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": tokens,
        "ignore_eos": True,
        "service_tier": "priority",
    }
    started = time.monotonic()
    resp = httpx.post(f"{impatient_gateway}/v1/chat/completions", json=body, timeout=300)
    took = time.monotonic() - started
    assert resp.status_code == 200, resp.text
    assert took > FIRST_BYTE_SECONDS, took  # longer than the first-byte timeout: not cut
    assert resp.headers["x-tiergate-tier"] == "fast"
    assert "x-tiergate-fallback" not in resp.headers
    assert resp.json()["service_tier"] == "priority"
    assert resp.json()["usage"]["completion_tokens"] == tokens
    assert metric_value(impatient_gateway, "tiergate_fallbacks_total") == 0
    assert metric_value(impatient_gateway, "tiergate_endpoint_ejections_total") == 0


def test_a_large_tokenize_answer_arrives_whole(
    gateway: str, vllm_servers: dict[Tier, VllmServer]
) -> None:
    """vLLM's 1.5 MB answer, through the gateway, equal to vLLM's own; ten at once eject
    nothing. (Its speed against vLLM alone is a benchmark's question, not one sample's.)"""
    body = {"model": MODEL, "prompt": "hello world " * 125_000}  # 1.5 MB
    direct = httpx.post(f"{vllm_servers[Tier.STANDARD].url}/tokenize", json=body, timeout=120)
    via = httpx.post(f"{gateway}/tokenize", json={**body, "service_tier": "default"}, timeout=120)
    assert len(direct.content) > 1_000_000
    assert via.status_code == 200, via.text[:300]
    assert via.json() == direct.json()
    with ThreadPoolExecutor(10) as pool:
        statuses = list(
            pool.map(
                lambda _: httpx.post(f"{gateway}/tokenize", json=body, timeout=120).status_code,
                range(10),
            )
        )
    assert statuses == [200] * 10
    assert metric_value(gateway, "tiergate_endpoint_ejections_total") == 0
