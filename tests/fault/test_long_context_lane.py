"""A flood of long prompts must not starve short requests.

FakeVllm models an engine with 4 sequence slots that spends time in proportion to the
prompt (a 24,000-character prompt holds a slot for 2.4 s; a short one for microseconds).
Bound stated: with the long-context lane capped at 2 in flight, every short request sent
during the flood completes within 1 s. The control run, with the cap lifted, shows the
same flood starving short requests (they wait for long prompts to finish), so the bound is
the lane's doing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.servers import gateway_settings, running_gateway

LONG = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 24_000}]}
SHORT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


async def _flood_and_probe(base: str) -> list[float]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0)) as client:

        async def long_request() -> None:
            # The flood outlasts the probe; giving up cancels it upstream.
            with contextlib.suppress(httpx.TimeoutException):
                await client.post(f"{base}/v1/chat/completions", json=LONG, timeout=4.0)

        flood = [asyncio.create_task(long_request()) for _ in range(24)]
        await asyncio.sleep(0.3)  # the flood has taken what it can take
        latencies = []
        stop = time.monotonic() + 2.5
        while time.monotonic() < stop:
            started = time.monotonic()
            resp = await client.post(f"{base}/v1/chat/completions", json=SHORT)
            assert resp.status_code == 200, resp.text
            latencies.append(time.monotonic() - started)
        for task in flood:
            task.cancel()
        await asyncio.gather(*flood, return_exceptions=True)
        return latencies


def _run(fake: FakeVllm, fast: FakeVllm, lane_cap: int) -> list[float]:
    fake.behaviour.slots = 4
    fake.behaviour.delay_per_prompt_char = 0.0001
    settings = gateway_settings(
        [fake.url],
        [fast.url],
        policy={"fallback": False},
        admission={"long_context_tokens": 4096, "long_context_max_concurrent": lane_cap},
    )
    with running_gateway(settings) as base:
        return asyncio.run(_flood_and_probe(base))


def test_short_requests_keep_flowing_during_a_long_prompt_flood(fakes: list[FakeVllm]) -> None:
    latencies = _run(fakes[0], fakes[2], lane_cap=2)
    assert len(latencies) >= 5
    assert max(latencies) < 1.0, latencies


def test_control_without_the_lane_cap_starves_short_requests(fakes: list[FakeVllm]) -> None:
    latencies = _run(fakes[1], fakes[2], lane_cap=64)
    assert max(latencies) > 1.0, latencies
