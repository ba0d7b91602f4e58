"""The proxied requests' HTTP client (tiergate.gateway.openai.upstreamhttp): connections reused
and sent without delay against a fake vLLM, and, against raw fake servers written here for
fault injection, what it does when a server closes, cuts, stalls or streams."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import orjson
import pytest

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tiergate.gateway.openai.upstreamhttp import (
    Origin,
    UpstreamClient,
    UpstreamDisconnected,
)

CHAT = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
JSON = {"content-type": "application/json"}
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[tuple[Origin, list[int]]]:
    """A fake HTTP server on loopback whose every connection runs ``handler``; yields its
    origin and a list that counts the connections it accepted."""
    accepted: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield Origin.parse(f"http://127.0.0.1:{port}"), accepted
    finally:
        server.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return head + await reader.readexactly(length)


def answer(body: bytes, *extra: bytes) -> bytes:
    head = [b"HTTP/1.1 200 OK", b"content-type: application/json", *extra]
    head.append(b"content-length: %d" % len(body))
    return b"\r\n".join(head) + b"\r\n\r\n" + body


async def post(client: UpstreamClient, origin: Origin, read_timeout: float = 5.0) -> bytes:
    resp = await client.post(
        origin, "/v1/chat/completions", CHAT, JSON, connect_timeout=5, read_timeout=read_timeout
    )
    assert resp.status == 200
    return await resp.read()


async def test_upstream_connection_is_reused_and_sent_without_delay(
    fakes: list[FakeVllm],
) -> None:
    client = UpstreamClient()
    origin = Origin.parse(fakes[0].url)
    seen = []
    try:
        for _ in range(5):
            body = orjson.loads(await post(client, origin))
            assert body["choices"][0]["message"]["content"]
            idle = client.idle_connections(origin)
            assert len(idle) == 1
            seen.append(idle[0])
        assert all(conn is seen[0] for conn in seen), "requests did not share one connection"
        assert seen[0].transport is not None
        sock: socket.socket = seen[0].transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        client.close()
    assert client.idle_connections(origin) == []


async def test_a_connection_closed_after_its_answer_is_not_used_again() -> None:
    """A server that closes every connection after one answer (as vLLM's uvicorn does to
    idle ones): each request still gets its answer, and each request reaches the server
    exactly once, whether the client saw the close before sending or only after."""
    requests: list[bytes] = []

    async def one_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests.append(await read_request(reader))
        writer.write(answer(b'{"n": %d}' % len(requests)))
        await writer.drain()

    async with raw_server(one_answer) as (origin, accepted):
        client = UpstreamClient()
        try:
            answers = [orjson.loads(await post(client, origin))["n"] for _ in range(4)]
        finally:
            client.close()
    assert answers == [1, 2, 3, 4]
    assert len(requests) == 4 and len(accepted) == 4


async def test_connection_close_is_honoured() -> None:
    async def close_after(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(b"{}", b"connection: close"))
        await writer.drain()
        await asyncio.sleep(0.5)  # keeps the socket open: only the header says "close"

    async with raw_server(close_after) as (origin, accepted):
        client = UpstreamClient()
        try:
            await post(client, origin)
            assert client.idle_connections(origin) == []
            await post(client, origin)
        finally:
            client.close()
    assert len(accepted) == 2


async def test_an_answer_cut_mid_body_is_an_error_and_not_reused() -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n" + b"x" * 10)
        await writer.drain()

    async with raw_server(cut) as (origin, _):
        client = UpstreamClient()
        try:
            resp = await client.post(
                origin, "/v1/chat/completions", CHAT, JSON, connect_timeout=5, read_timeout=5
            )
            with pytest.raises(UpstreamDisconnected):
                await resp.read()
            resp.close()
            assert client.idle_connections(origin) == []
        finally:
            client.close()


async def test_a_server_that_never_answers_times_out_and_is_disconnected() -> None:
    gone = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await reader.read()  # returns at the client's close
        gone.set()

    async with raw_server(silent) as (origin, _):
        client = UpstreamClient()
        try:
            started = time.monotonic()
            with pytest.raises(TimeoutError):
                await post(client, origin, read_timeout=0.3)
            assert time.monotonic() - started < 3
            # The connection is cut, which is what makes vLLM abort the request.
            await asyncio.wait_for(gone.wait(), 5)
        finally:
            client.close()


async def test_a_stream_is_read_as_it_arrives() -> None:
    read_first = asyncio.Event()

    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n7\r\ndata: 1\r\n"
        )
        await writer.drain()
        await asyncio.wait_for(read_first.wait(), 5)  # the second part waits for the first
        writer.write(b"7\r\ndata: 2\r\n0\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.5)

    async with raw_server(chunked) as (origin, accepted):
        client = UpstreamClient()
        try:
            resp = await client.post(
                origin, "/v1/chat/completions", CHAT, JSON, connect_timeout=5, read_timeout=5
            )
            assert resp.headers["content-type"] == "text/event-stream"
            assert await resp.readany() == b"data: 1"
            read_first.set()
            rest = b""
            while chunk := await resp.readany():
                rest += chunk
            assert rest == b"data: 2"
            # Read to its end, the connection is kept for the next request.
            assert len(client.idle_connections(origin)) == 1
        finally:
            client.close()
    assert len(accepted) == 1


async def test_bytes_nobody_asked_for_drop_the_connection() -> None:
    """An answer followed by a second one (in the same write, then later on the idle
    connection): the first is the request's answer; the connection is not used again, so
    the next request cannot take the stray bytes for its own answer."""

    # Set once a handler has sent its stray bytes: the next request waits for it, not
    # for a time that a slow machine may overrun.
    sent = asyncio.Event()

    async def chatty(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(b'{"n": 1}') + answer(b'{"n": "stray"}'))
        await writer.drain()
        sent.set()
        await asyncio.sleep(0.5)

    async def stray_later(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(b'{"n": 1}'))
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.write(answer(b'{"n": "stray"}'))
        await writer.drain()
        sent.set()
        await asyncio.sleep(0.5)

    for handler in (chatty, stray_later):
        sent.clear()
        async with raw_server(handler) as (origin, accepted):
            client = UpstreamClient()
            try:
                assert orjson.loads(await post(client, origin)) == {"n": 1}
                await asyncio.wait_for(sent.wait(), 10)
                # The idle connection is closed as its stray bytes arrive (polled, within 5 s).
                for _ in range(500):
                    if all(c.closed for c in client.idle_connections(origin)):
                        break
                    await asyncio.sleep(0.01)
                assert all(c.closed for c in client.idle_connections(origin)), handler.__name__
                assert orjson.loads(await post(client, origin)) == {"n": 1}
            finally:
                client.close()
        assert len(accepted) == 2, handler.__name__
