"""The client connection's writes of one pass of the event loop leave in one send
(tiergate.gateway.openai.coalesce): on a recording fake transport, and under a real uvicorn
server whose real transport's writes are counted."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn

from tests.waiting import eventually
from tiergate.gateway.openai.coalesce import (
    FLUSH_AT_BYTES,
    CoalescingHttpToolsProtocol,
    CoalescingTransport,
)
from tiergate.gateway.serving import uvicorn_options
from tiergate.measure.ports import free_port
from tiergate.settings import load_settings


class FakeTransport:
    """Records what reaches the connection (a fake: no socket)."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = self.aborted = False
        self.buffered = 0

    def write(self, data: bytes) -> None:
        assert not self.closed, "a write after the close"
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 1)}.get(name, default)


async def _a_pass() -> None:
    await asyncio.sleep(0)
    await asyncio.sleep(0)


async def test_writes_of_one_pass_leave_in_one_send_in_order() -> None:
    fake = FakeTransport()
    t = CoalescingTransport(fake, asyncio.get_running_loop())  # type: ignore[arg-type]
    t.write(b"HTTP/1.1 200 OK\r\n\r\n")
    t.write(b"")
    t.write(bytearray(b"body"))
    assert fake.writes == []  # held until the pass ends
    assert t.get_write_buffer_size() == len(b"HTTP/1.1 200 OK\r\n\r\nbody")
    await _a_pass()
    assert fake.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
    t.write(b"later")
    await _a_pass()
    t.writelines([b"a", b"b"])
    await _a_pass()
    assert fake.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody", b"later", b"ab"]


async def test_a_pass_that_writes_a_lot_sends_at_the_flow_control_mark() -> None:
    """uvicorn checks flow control before each write: past the mark, writes go out at
    once, so the transport can pause the writer as it did before."""
    fake = FakeTransport()
    t = CoalescingTransport(fake, asyncio.get_running_loop())  # type: ignore[arg-type]
    piece = b"x" * (FLUSH_AT_BYTES // 4)
    for _ in range(4):
        t.write(piece)
    assert fake.writes == [piece * 4]  # sent when the mark was reached, in the same pass
    t.write(b"tail")
    assert t.get_write_buffer_size() == 4
    await _a_pass()
    assert fake.writes == [piece * 4, b"tail"]


async def test_close_sends_what_was_written_first_and_abort_drops_it() -> None:
    fake = FakeTransport()
    t = CoalescingTransport(fake, asyncio.get_running_loop())  # type: ignore[arg-type]
    t.write(b"last words")
    t.close()
    assert fake.writes == [b"last words"] and fake.closed
    await _a_pass()  # the scheduled send finds nothing left and writes nothing
    assert fake.writes == [b"last words"]

    fake = FakeTransport()
    t = CoalescingTransport(fake, asyncio.get_running_loop())  # type: ignore[arg-type]
    t.write(b"never")
    t.abort()
    await _a_pass()
    assert fake.writes == [] and fake.aborted


async def test_a_connection_closed_meanwhile_gets_no_write() -> None:
    fake = FakeTransport()
    t = CoalescingTransport(fake, asyncio.get_running_loop())  # type: ignore[arg-type]
    t.write(b"late")
    fake.closed = True  # the peer went away before the pass ended
    await _a_pass()
    assert fake.writes == []
    assert t.is_closing() and t.get_extra_info("peername") == ("127.0.0.1", 1)


# -- under a real uvicorn server ------------------------------------------------------------


class _Counted:
    """The real transport, its writes counted."""

    def __init__(self, transport: Any, log: list[bytes]) -> None:
        self._transport, self._log = transport, log

    def write(self, data: bytes) -> None:
        self._log.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _counting_protocol(log: list[bytes]) -> type[CoalescingHttpToolsProtocol]:
    class Counting(CoalescingHttpToolsProtocol):
        def connection_made(self, transport: Any) -> None:
            super().connection_made(_Counted(transport, log))

    return Counting


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await receive()
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for part in (b"one", b"two", b"three"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
            await asyncio.sleep(0.05)
        await send({"type": "http.response.body", "body": b""})
        return
    body = b'{"ok": true}'
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if scope["path"] == "/close":
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@contextmanager
def _server(log: list[bytes]) -> Iterator[str]:
    options = uvicorn_options(load_settings().gateway)
    assert options["http"].func is CoalescingHttpToolsProtocol
    options["http"] = _counting_protocol(log)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(_app, host="127.0.0.1", port=port, **options))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    eventually(lambda: server.started or not thread.is_alive(), 20, 0.02, "the server started")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def test_an_answer_is_one_write_and_a_stream_a_write_per_chunk() -> None:
    log: list[bytes] = []
    with _server(log) as base, httpx.Client(base_url=base) as client:
        for _ in range(3):  # keep-alive: each answer on the same connection, one write each
            answer = client.post("/json", content=b"{}")
            assert answer.status_code == 200 and answer.json() == {"ok": True}
        assert len(log) == 3
        assert all(w.startswith(b"HTTP/1.1 200 OK") and w.endswith(b'{"ok": true}') for w in log)

        log.clear()
        with client.stream("POST", "/stream", content=b"{}") as streamed:
            parts = list(streamed.iter_bytes())
        assert b"".join(parts) == b"onetwothree"
        # The head goes out with the first chunk; each later chunk, its own pass, alone;
        # the chunked body's end last.
        assert len(log) == 4 and log[0].startswith(b"HTTP/1.1 200 OK") and b"one" in log[0]
        assert log[-1] == b"0\r\n\r\n"


def test_a_connection_closed_by_the_answer_gets_all_of_it() -> None:
    log: list[bytes] = []
    with _server(log) as base:
        port = int(base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"POST /close HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
            received = b""
            while chunk := sock.recv(65536):  # until the server's FIN
                received += chunk
        assert received.startswith(b"HTTP/1.1 200 OK") and received.endswith(b'{"ok": true}')
        assert b"connection: close" in received.lower()
        assert len(log) == 1
