"""The gateway benchmark's fixed-rate load (tiergate.bench.load.fixed_rate): several
systems measured at once, each at the rate asked, their requests interleaved evenly."""

from __future__ import annotations

import time

from aiohttp import web
from aiohttp.test_utils import TestServer

from tiergate.bench.load import combined, fixed_rate


async def test_each_url_gets_the_rate_and_the_requests_interleave() -> None:
    arrivals: list[tuple[str, float]] = []

    async def answer(request: web.Request) -> web.Response:
        arrivals.append((request.match_info["system"], time.perf_counter()))
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/{system}/v1/chat/completions", answer)
    async with TestServer(app) as server:
        urls = [str(server.make_url(f"/{name}/v1/chat/completions")) for name in ("a", "b", "c")]
        latencies = await fixed_rate(urls, rate=20.0, duration=1.0)
    assert [len(found) for found in latencies] == [20, 20, 20]
    assert all(ms > 0 for found in latencies for ms in found)
    measured = arrivals[-60:]  # after the 50 warm-up rounds
    # One request to each system in every 1/20 s, in the same order, 1/60 s apart.
    assert [name for name, _ in measured] == ["a", "b", "c"] * 20
    span = measured[-1][1] - measured[0][1]
    assert 59 / 60 * 0.8 < span < 59 / 60 * 1.5, span


def test_saturation_turns_combine_into_one_figure() -> None:
    turns = [
        {"rps": 1000.0, "non_2xx": 0.0, "p50_ms": 2.0, "p99_ms": 9.0},
        {"rps": 800.0, "non_2xx": 3.0, "p50_ms": 3.0, "p99_ms": 5.0},
        {"rps": 1200.0, "non_2xx": 1.0, "p50_ms": 1.0, "p99_ms": 7.0},
    ]
    assert combined(turns) == {"rps": 1000.0, "non_2xx": 4.0, "p50_ms": 2.0, "p99_ms": 7.0}
