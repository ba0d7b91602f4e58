"""The gateway's upstream connections: reused across requests, with TCP_NODELAY."""

from __future__ import annotations

import socket
from types import SimpleNamespace
from typing import Any

import aiohttp

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tiergate.gateway.app import upstream_session

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


async def test_upstream_connection_is_reused_and_sent_without_delay(
    fakes: list[FakeVllm],
) -> None:
    session = upstream_session()
    created: list[int] = []
    reused: list[int] = []

    async def on_create(s: aiohttp.ClientSession, ctx: SimpleNamespace, params: Any) -> None:
        created.append(1)

    async def on_reuse(s: aiohttp.ClientSession, ctx: SimpleNamespace, params: Any) -> None:
        reused.append(1)

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(on_create)
    trace.on_connection_reuseconn.append(on_reuse)
    trace.freeze()
    session._trace_configs.append(trace)
    try:
        for _ in range(5):
            async with session.post(f"{fakes[0].url}/v1/chat/completions", json=CHAT) as resp:
                assert resp.status == 200
                await resp.read()
        # The idle connection back in the pool (aiohttp keeps no public handle on it).
        pooled = [proto for conns in session.connector._conns.values() for proto, _ in conns]  # type: ignore[union-attr]
        assert len(pooled) == 1
        sock: socket.socket = pooled[0].transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        await session.close()
    assert (len(created), len(reused)) == (1, 4), "requests did not share one connection"
