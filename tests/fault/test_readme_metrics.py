"""The README's metrics that no other test read: time per output token, the gateway's own
overhead, prompt tokens and the admission queue's wait. Three streamed requests at once
through a real gateway whose standard tier admits one at a time, over FakeVllm (a fake
engine, named as one): each metric counts exactly those requests, and the queue's wait
is more than nothing, since two of them waited."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.fault.helpers import metric_value
from tests.servers import gateway_settings, running_gateway

STREAMS = 3


def test_the_readmes_metrics_count_what_they_say(fakes: list[FakeVllm]) -> None:
    fakes[0].behaviour.chunk_delay = 0.05  # five chunks: each stream holds its slot a while
    settings = gateway_settings(
        [fakes[0].url],
        [fakes[2].url],
        policy={"fallback": False},
        # Only the standard tier named: the fast one keeps its defaults.
        admission={"tiers": {"standard": {"max_concurrent": 1, "max_queue": 8}}},
    )
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}

    def stream() -> int:
        with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=30) as resp:
            resp.read()
            return resp.status_code

    with running_gateway(settings) as base:
        with ThreadPoolExecutor(STREAMS) as pool:
            assert list(pool.map(lambda _: stream(), range(STREAMS))) == [200] * STREAMS
        std = {"tier": "standard"}
        assert metric_value(base, "tiergate_time_per_output_token_seconds_count", **std) == 3
        assert metric_value(base, "tiergate_time_per_output_token_seconds_sum", **std) > 0
        assert metric_value(base, "tiergate_gateway_overhead_seconds_count", stream="true") == 3
        # The fake's usage says 3 prompt tokens a request (the gateway asks for usage).
        prompt = metric_value(base, "tiergate_prompt_tokens_total", model=MODEL, **std)
        assert prompt == 3 * STREAMS
        assert metric_value(base, "tiergate_admission_wait_seconds_count", **std) == 3
        assert metric_value(base, "tiergate_admission_wait_seconds_sum", **std) > 0.05
