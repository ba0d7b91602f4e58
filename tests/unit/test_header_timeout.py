"""The serving port's header read timeout (gateway.header_read_timeout_seconds): a real
uvicorn server on loopback, with the gateway's options, and raw sockets for the clients
that send nothing, or their headers byte by byte."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.servers import serving_app
from tiergate.settings import load_settings

TIMEOUT = 0.5
# A busy 2-core CI machine may pause the server or the test this long.
MARGIN = 2.5
# A second handler's time, past the timeout: it must not count against the headers.
SLOW_SECONDS = 1.5
# One byte every 0.2 s: these headers take 11 s to arrive, far past TIMEOUT + MARGIN.
DRIBBLE_EVERY = 0.2
DRIBBLED = b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\nuser-agent: slowloris/1.0\r\n\r\n"
REQUEST = b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"
SLOW_REQUEST = b"GET /slow HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    await receive()
    if scope["path"] == "/slow":
        await asyncio.sleep(SLOW_SECONDS)
    body = scope["path"].encode()
    headers = [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    gateway = load_settings(
        # Keep-alive far longer than the header timeout: only the latter closes below.
        gateway={"header_read_timeout_seconds": TIMEOUT, "keep_alive_seconds": 30}
    ).gateway
    with serving_app(_app, gateway) as (port, _):
        yield port


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def _wait_closed(sock: socket.socket, until: float) -> tuple[bool, bytes]:
    """Read until the server closes the connection or ``until`` (monotonic) passes:
    whether it closed, and what it sent meanwhile."""
    received = b""
    while (left := until - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            data = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            return True, received
        if not data:
            return True, received
        received += data
    return False, received


def _dribble(sock: socket.socket, data: bytes) -> tuple[float | None, int, bytes]:
    """Send ``data`` one byte every DRIBBLE_EVERY seconds, watching for the close: when
    the server closed the connection (seconds after the first byte; None: never), how
    many bytes had been sent, and what the server sent."""
    started = time.monotonic()
    received = b""
    for sent in range(len(data)):
        try:
            sock.sendall(data[sent : sent + 1])
        except OSError:  # the server's close came back as a reset
            return time.monotonic() - started, sent, received
        closed, got = _wait_closed(sock, time.monotonic() + DRIBBLE_EVERY)
        received += got
        if closed:
            return time.monotonic() - started, sent + 1, received
    closed, got = _wait_closed(sock, time.monotonic() + MARGIN)  # then it would answer
    return (time.monotonic() - started if closed else None), len(data), received + got


def _response(sock: socket.socket) -> bytes:
    """One whole response (its head and a content-length body) from the connection."""
    deadline = time.monotonic() + SLOW_SECONDS + MARGIN
    data = b""
    while True:
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep:
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            if len(body) >= length:
                assert len(body) == length, "more than one response"
                return data
        left = deadline - time.monotonic()
        assert left > 0, f"no whole response in time: {data!r}"
        sock.settimeout(left)
        chunk = sock.recv(65536)
        assert chunk, f"closed before the whole response: {data!r}"
        data += chunk


def _assert_ok(response: bytes, body: bytes) -> None:
    assert response.startswith(b"HTTP/1.1 200 OK\r\n"), response
    assert response.endswith(b"\r\n\r\n" + body), response
    assert b"connection: close" not in response.lower(), response


def test_a_connection_that_sends_nothing_is_closed(port: int) -> None:
    with _connect(port) as sock:
        started = time.monotonic()
        closed, received = _wait_closed(sock, started + TIMEOUT + MARGIN)
        elapsed = time.monotonic() - started
    assert closed, f"still open {TIMEOUT + MARGIN:g} s after connecting"
    assert received == b""  # closed, not answered
    assert elapsed >= TIMEOUT - 0.1  # the timeout's doing, not an instant refusal


def test_headers_sent_byte_by_byte_are_cut_before_they_are_complete(port: int) -> None:
    with _connect(port) as sock:
        closed_at, sent, received = _dribble(sock, DRIBBLED)
    assert closed_at is not None, "the dribbled headers were never cut"
    assert sent < len(DRIBBLED) and received == b"", (sent, received)
    assert closed_at < TIMEOUT + MARGIN, closed_at


def test_the_next_request_on_a_kept_alive_connection_is_bounded_too(port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(REQUEST)
        _assert_ok(_response(sock), b"/")
        # uvicorn's keep-alive timer (30 s here) is cancelled by the first byte of the
        # next request: the header timeout, armed by the response, still cuts it.
        closed_at, sent, received = _dribble(sock, DRIBBLED)
    assert closed_at is not None, "the second request's dribbled headers were never cut"
    assert sent < len(DRIBBLED) and received == b"", (sent, received)
    assert closed_at < TIMEOUT + MARGIN, closed_at


def test_a_handler_slower_than_the_timeout_is_answered_in_full(port: int) -> None:
    with _connect(port) as sock:
        # Headers at once, then a handler three times the timeout: the timer is disarmed
        # by the headers, so the answer comes whole, and twice on the same connection.
        for _ in range(2):
            sock.sendall(SLOW_REQUEST)
            _assert_ok(_response(sock), b"/slow")
        # Armed again by the last response: the idle connection is closed by it.
        started = time.monotonic()
        closed, received = _wait_closed(sock, started + TIMEOUT + MARGIN)
    assert closed and received == b"", received


def test_a_pipelined_request_is_not_cut_while_its_handler_runs(port: int) -> None:
    with _connect(port) as sock:
        # Both requests' headers in one send: the second's are complete while the first
        # runs, and it starts when the first's response completes, the timer unarmed.
        sock.sendall(SLOW_REQUEST + SLOW_REQUEST)
        first = _response(sock)
        _assert_ok(first, b"/slow")
        _assert_ok(_response(sock), b"/slow")
