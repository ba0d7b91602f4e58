"""``flex`` and a busy ``priority`` through a real gateway over FakeVllm, with the official
``openai`` client: what OpenAI's own clients see (the echo, the 429, the move to default)."""

from __future__ import annotations

import threading

import httpx
import openai
import pytest

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.fault.helpers import metric_value
from tests.servers import gateway_settings, running_gateway
from tests.waiting import eventually

MESSAGES = [{"role": "user", "content": "hi"}]
CHAT = {"model": MODEL, "messages": MESSAGES}


def _client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=30)


def test_flex_is_echoed_flex_streamed_or_not(fakes: list[FakeVllm]) -> None:
    settings = gateway_settings([fakes[0].url], [fakes[2].url])
    with running_gateway(settings) as base:
        client = _client(base)
        answer = client.chat.completions.create(model=MODEL, messages=MESSAGES, service_tier="flex")
        assert answer.service_tier == "flex"
        stream = client.chat.completions.create(
            model=MODEL, messages=MESSAGES, service_tier="flex", stream=True
        )
        tiers = {chunk.service_tier for chunk in stream}
        assert tiers == {"flex"}
        assert fakes[0].record.requests == 2 and fakes[2].record.requests == 0  # standard
        plain = client.chat.completions.create(model=MODEL, messages=MESSAGES)
        assert plain.service_tier == "default"


def test_a_full_flex_lane_is_429_resource_unavailable_while_default_is_served(
    fakes: list[FakeVllm],
) -> None:
    fakes[0].behaviour.chunk_delay = 1.0
    settings = gateway_settings(
        [fakes[0].url],
        [fakes[2].url],
        admission={"flex": {"max_concurrent": 1, "max_queue": 0, "retry_after_seconds": 3}},
    )
    with running_gateway(settings) as base:
        url = f"{base}/v1/chat/completions"
        first: list[int] = []
        holder = threading.Thread(
            target=lambda: first.append(
                httpx.post(url, json={**CHAT, "service_tier": "flex"}, timeout=30).status_code
            )
        )
        holder.start()
        eventually(
            lambda: (
                metric_value(base, "tiergate_admission_in_flight", tier="standard", lane="flex")
                == 1
            ),
            what="the first flex request holding the lane's one slot",
        )
        with pytest.raises(openai.RateLimitError) as refused:
            _client(base).chat.completions.create(
                model=MODEL, messages=MESSAGES, service_tier="flex"
            )
        assert refused.value.code == "resource_unavailable"
        assert refused.value.response.headers["retry-after"] == "3"
        interactive = httpx.post(url, json=CHAT, timeout=30)
        assert interactive.status_code == 200
        assert interactive.json()["service_tier"] == "default"
        holder.join()
        assert first == [200]


def test_priority_the_fast_tier_cannot_take_is_served_at_default(fakes: list[FakeVllm]) -> None:
    fakes[2].behaviour.chunk_delay = 1.0
    settings = gateway_settings(
        [fakes[0].url],
        [fakes[2].url],
        admission={
            "priority_wait_seconds": 0.2,
            "tiers": {"fast": {"max_concurrent": 1, "max_queue": 8}},
        },
    )
    with running_gateway(settings) as base:
        url = f"{base}/v1/chat/completions"
        busy = threading.Thread(
            target=httpx.post,
            args=(url,),
            kwargs={"json": {**CHAT, "service_tier": "priority"}, "timeout": 30},
        )
        busy.start()
        eventually(lambda: fakes[2].record.requests == 1, what="the fast engine's one slot taken")
        raw = _client(base).chat.completions.with_raw_response.create(
            model=MODEL, messages=MESSAGES, service_tier="priority"
        )
        busy.join()
        assert raw.parse().service_tier == "default"
        assert raw.headers["x-tiergate-tier"] == "standard"
        assert raw.headers["x-tiergate-tier-reason"] == "busy"
        assert fakes[0].record.requests == 1
