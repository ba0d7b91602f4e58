"""Flow control and token-weighted fairness through a real gateway with keys over FakeVllm
(issue 52 items 1-2): tenant A floods at its full concurrency on an engine whose step grows
with its batch (FakeBehaviour.load_delay), tenant B sends one request at a time, both of the
same priority. What an operator checks: the tier's limit on /metrics falls below the
flood, the engine then holds no more than that limit, and B is served without queueing
behind A's backlog. A fake engine's timing, so the assertions are about the machinery,
with wide margins; what it is worth on a real engine is `tiergate bench fairness`'s to
say."""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.fault.helpers import metric_value
from tests.fault.test_shared_limits_redis import RedisServer, redis_server  # noqa: F401
from tests.servers import gateway_settings, running_gateway
from tests.waiting import eventually
from tiergate.accesssettings import FairShareSettings
from tiergate.gateway.access.auth import new_key
from tiergate.gateway.access.fairshare import ServedTokens
from tiergate.gateway.access.gate import Gate

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
FLOOD = 16


@contextmanager
def _loops(url: str, key: str, count: int) -> Iterator[list[tuple[int, float]]]:
    """``count`` clients of ``key`` sending one streamed request after another until the
    block ends; yields each answer's status and seconds."""
    stop = threading.Event()
    answers: list[tuple[int, float]] = []

    def loop() -> None:
        headers = {"authorization": f"Bearer {key}"}
        with httpx.Client(timeout=60, headers=headers) as client:
            while not stop.is_set():
                started = time.perf_counter()
                resp = client.post(url, json=CHAT)
                answers.append((resp.status_code, time.perf_counter() - started))

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(count)]
    for t in threads:
        t.start()
    try:
        yield answers
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)


def test_a_flood_is_held_to_what_the_engine_takes_and_a_quiet_tenant_does_not_wait_behind_it(
    fakes: list[FakeVllm],
) -> None:
    engine = fakes[0]
    engine.behaviour.chunks = 8
    engine.behaviour.chunk_delay = 0.01
    engine.behaviour.load_delay = 0.01
    (key_a, hash_a), (key_b, hash_b) = new_key(), new_key()
    limits = {"max_concurrent": FLOOD}
    auth = {
        "enabled": True,
        "keys": [
            {"name": "a", "hash": hash_a, "limits": limits},
            {"name": "b", "hash": hash_b, "limits": limits},
        ],
    }
    settings = gateway_settings(
        [engine.url],
        [fakes[2].url],
        auth=auth,
        admission={"flow": {"adjust_seconds": 0.3, "min_concurrent": 2}},
    )
    with running_gateway(settings) as base:
        url = f"{base}/v1/chat/completions"

        def limit() -> float:
            return metric_value(base, "tiergate_admission_limit", tier="standard")

        # B alone first: the reference (a request or two in flight).
        with _loops(url, key_b, 1) as alone:
            eventually(lambda: len(alone) >= 10, timeout=30)
        assert limit() == 64  # nothing was slowed: the tier's limit is untouched
        with _loops(url, key_a, FLOOD) as flood:
            eventually(lambda: limit() < FLOOD / 2, timeout=30)
            # The engine drains to what the tier lets through.
            eventually(lambda: engine.record.in_flight <= limit(), timeout=20)
            mark = len(flood)
            with _loops(url, key_b, 1) as quiet:
                eventually(lambda: len(quiet) >= 10, timeout=60)
            during = flood[mark:]  # A's answers while B was measured
            flood_seen = list(flood)
        assert {s for s, _ in alone + quiet + flood_seen} == {200}
        # A's requests wait behind A's own backlog; B's take a reserved slot (or the next
        # one that frees) and never wait behind A's.
        # B's answers take what the engine takes; A's wait behind A's backlog as well.
        b_seconds = statistics.median(t for _, t in quiet)
        a_seconds = statistics.median(t for _, t in during)
        assert b_seconds < a_seconds / 2, (b_seconds, a_seconds)


async def test_two_replicas_order_by_one_count_through_redis(
    redis_server: RedisServer,  # noqa: F811
) -> None:
    """What one replica served a tenant moves that tenant back in the other replica's
    queue: each adds its own charges to Redis and reads back the tenants it has waiting."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(redis_server.url)
    try:
        settings = FairShareSettings()
        first, second = ServedTokens(settings, "g"), ServedTokens(settings, "g")
        first.charge("a", 900)
        second.charge("b", 100)
        await first.sync(client, ["a", "b"])
        await second.sync(client, ["a", "b"])
        assert second.served("a") == pytest.approx(900, rel=0.05)
        assert second.served("b") == pytest.approx(100, rel=0.05)
        # The second replica's queue now puts b (served less everywhere) ahead of a.
        gate = Gate(1, 8, served=second.served)
        assert gate.try_enter("x")
        wait_a = asyncio.ensure_future(gate.enter(0, 5, "a"))
        wait_b = asyncio.ensure_future(gate.enter(0, 5, "b"))
        await asyncio.sleep(0)
        gate.leave("x")
        await asyncio.sleep(0)
        assert wait_b.done() and not wait_a.done()
        wait_a.cancel()
        # A replica's charges are not added twice: a second sync with nothing new.
        await first.sync(client, ["a"])
        assert first.served("a") == pytest.approx(900, rel=0.05)
    finally:
        await client.aclose()
