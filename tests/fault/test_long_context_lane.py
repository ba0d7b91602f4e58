"""A flood of long prompts must not starve short requests.

FakeVllm models an engine with 4 sequence slots that spends time in proportion to the
prompt (a 24,000-character prompt holds a slot for 2.4 s; a short one for microseconds).
What is asserted is the engine's own account, not a time: with the long-context lane
capped at 2 in flight, no short request sent during the flood finds the engine's slots all
taken by long prompts (so none waits for one to finish, on any CPU). The control run, with
the cap lifted, shows the same flood taking every slot, short requests waiting behind it,
so the bound is the lane's doing.
"""

from __future__ import annotations

import asyncio
import contextlib

import httpx

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.servers import gateway_settings, running_gateway

LONG = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 24_000}]}
SHORT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
PROBES = 10


async def _flood_and_probe(base: str, fake: FakeVllm, holding: int) -> None:
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0)) as client:

        async def long_request() -> None:
            # Giving up cancels it upstream.
            with contextlib.suppress(httpx.TimeoutException):
                await client.post(f"{base}/v1/chat/completions", json=LONG, timeout=4.0)

        flood = [asyncio.create_task(long_request()) for _ in range(24)]
        # The flood has taken what the gateway lets it take of the engine's slots.
        for _ in range(500):
            if fake.record.in_slots >= holding:
                break
            await asyncio.sleep(0.02)
        assert fake.record.in_slots >= holding, fake.record.in_slots
        for _ in range(PROBES):
            resp = await client.post(f"{base}/v1/chat/completions", json=SHORT)
            assert resp.status_code == 200, resp.text
        for task in flood:
            task.cancel()
        await asyncio.gather(*flood, return_exceptions=True)


def _run(fake: FakeVllm, fast: FakeVllm, lane_cap: int) -> list[bool]:
    """Whether each short request found every slot taken (had to wait for one)."""
    fake.behaviour.slots = 4
    # A long prompt holds its slot for 2.4 s; each gives up after 4 s (cancelled upstream,
    # before the gateway's first-byte timeout would count against the engine).
    fake.behaviour.delay_per_prompt_char = 0.0001
    settings = gateway_settings(
        [fake.url],
        [fast.url],
        policy={"fallback": False},
        admission={"long_context_tokens": 4096, "long_context_max_concurrent": lane_cap},
    )
    with running_gateway(settings) as base:
        asyncio.run(_flood_and_probe(base, fake, min(lane_cap, 4)))
    waits = [waited for chars, waited in fake.record.slot_waits if chars < 100]
    assert len(waits) == PROBES, fake.record.slot_waits
    return waits


def test_short_requests_keep_flowing_during_a_long_prompt_flood(fakes: list[FakeVllm]) -> None:
    assert not any(_run(fakes[0], fakes[2], lane_cap=2))


def test_control_without_the_lane_cap_starves_short_requests(fakes: list[FakeVllm]) -> None:
    assert any(_run(fakes[1], fakes[2], lane_cap=64))
