"""The HTTP/1.1 client of the proxied requests, the gateway's hot path: one POST on a kept-
alive connection, the answer's status first, then its body whole or as it arrives.

Why not aiohttp, which the gateway still uses for everything else (health checks, load
scrapes, model lists): per proxied request, aiohttp's client ran about 130 Python calls
(request and response objects, header multidicts, cookie and tracing hooks, a timer per
read), a third of the gateway's own CPU per request, and the gateway's added latency at
a low request rate (issue 14) is its CPU per request. This client is what a proxy needs and
no more: the request goes out in one ``write`` (head and body), httptools (the parser
uvicorn uses) parses the answer, and a connection goes back to its origin's pool when its
answer was read to the end. Everything else is refused rather than half-supported:
no redirects, no cookies, no proxies, no compression (the engines send none unasked).

Errors are :class:`OSError` subclasses, so that callers catch one family; a timeout is
:class:`TimeoutError`. A request sent on a reused connection that the server closed while
it sat idle (the keep-alive race: vLLM's uvicorn closes idle connections after 5 s) is
sent again once on a new connection, which is safe because no byte of an answer came.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

# Above this many unread body bytes the connection stops reading (a slow client of a
# stream must not make the gateway buffer the engine's whole answer).
_READ_HIGH_WATER = 1 << 20


class UpstreamDisconnected(ConnectionResetError):
    """The server closed the connection before its answer was complete."""


class UpstreamProtocolError(ConnectionError):
    """The server's bytes are not an HTTP/1.1 answer."""


@dataclass(frozen=True, slots=True)
class Origin:
    """Where an endpoint's requests go: parsed once per endpoint URL."""

    host: str
    port: int
    tls: bool
    host_header: bytes
    base_path: str

    @classmethod
    def parse(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        return cls(
            host=parts.hostname,
            port=port,
            tls=tls,
            host_header=parts.netloc.encode("idna"),
            base_path=parts.path.rstrip("/"),
        )


class _Connection(asyncio.Protocol):
    """One upstream connection and the answer being received on it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False
        self.in_use = False
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.got_bytes = False
        self.error: BaseException | None = None
        self.body: deque[bytes] = deque()
        self.buffered = 0
        self._until_eof = True

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCP transport is no subclass of asyncio.Transport; it has its methods.
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # A request's last segment must not wait for the ACK of the one before.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if not self.in_use:
            # Bytes with no request out (after a complete answer, or on an idle connection)
            # would be read as the next request's answer: the connection is dropped.
            self.abort()
            return
        self.got_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamProtocolError(f"bad HTTP answer: {exc}"))
            self.abort()

    def eof_received(self) -> bool:
        return False  # close the connection; connection_lost says what that means

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.complete or self.error is not None:
            return
        if self.headers_done and self._until_eof:
            self.complete = True  # an answer without length ends with its connection
            self._wake()
            return
        reason = f" ({exc})" if exc else ""
        self._fail(UpstreamDisconnected(f"the server closed the connection{reason}"))

    # -- httptools callbacks ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.complete:
            # A second answer in the same bytes as the first: not for any request of ours
            # (raising here stops the parser; data_received drops the connection).
            raise UpstreamProtocolError("an answer nobody asked for")

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        if key in ("content-length", "transfer-encoding"):
            self._until_eof = False
        self.headers.setdefault(key, value.decode("latin-1"))

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        if self.status in (204, 304) or 100 <= self.status < 200:
            self._until_eof = False
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.buffered += len(body)
        if self.buffered > _READ_HIGH_WATER and not self._paused and self.transport:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        # Asked here: once this callback returns, the parser says False whatever was sent.
        self.keep_alive = self._parser.should_keep_alive()
        self.complete = True
        self.in_use = False
        self._wake()

    # -- the reading side ---------------------------------------------------------------------

    def _fail(self, exc: BaseException) -> None:
        if self.error is None and not self.complete:
            self.error = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, seconds: float | None) -> None:
        """Until something more is known of the answer, or ``seconds`` (then TimeoutError)."""
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        # A timer that fails the waiter, rather than asyncio.timeout(): no context manager,
        # no task cancellation and uncancel on the hot path (two waits per request).
        timer = None if seconds is None else loop.call_later(seconds, _expire, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def take_body(self) -> bytes:
        data = b"".join(self.body) if len(self.body) != 1 else self.body[0]
        self.body.clear()
        self.buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    def reusable(self) -> bool:
        return (
            self.complete
            and not self.closed
            and self.transport is not None
            and not self.transport.is_closing()
            and self.keep_alive
        )

    def recycle(self) -> None:
        self._reset()
        self.reused = True
        self.idle_since = time.monotonic()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class UpstreamResponse:
    """An answer whose status line and headers have arrived. Read it whole with
    :meth:`read`, or as it comes with :meth:`readany`; :meth:`close` ends it, handing the
    connection back when the answer was read to the end and cutting it otherwise (which
    makes vLLM abort the request)."""

    def __init__(
        self, conn: _Connection, client: UpstreamClient, key: Origin, read_timeout: float | None
    ) -> None:
        self._conn = conn
        self._client = client
        self._key = key
        self._read_timeout = read_timeout
        self._done = False
        self.status = conn.status
        self.headers = conn.headers

    async def readany(self, wait_seconds: float | None = None) -> bytes:
        """The body bytes that have arrived, waiting for some (each wait at most
        ``wait_seconds``, by default the response's read timeout; then TimeoutError);
        ``b""`` at its end."""
        conn = self._conn
        if wait_seconds is None:
            wait_seconds = self._read_timeout
        while True:
            if conn.body:
                return conn.take_body()
            if conn.error is not None:
                raise conn.error
            if conn.complete or self._done:
                self.close()
                return b""
            await conn.wait(wait_seconds)

    async def read(self) -> bytes:
        """The whole body. What has arrived is taken while the rest comes, so that a body
        over the read high-water mark keeps the connection reading (else it would stop
        at the mark and wait for a completion that can no longer come)."""
        conn = self._conn
        parts: list[bytes] | None = None  # only for a body over the mark: no list per read
        while not conn.complete:
            if conn.error is not None:
                raise conn.error
            if self._done:
                raise UpstreamDisconnected("the answer was closed before it was read")
            if conn.buffered > _READ_HIGH_WATER:
                parts = parts or []
                parts.append(conn.take_body())
            await conn.wait(self._read_timeout)
        data = conn.take_body()
        self.close()
        if parts is not None:
            parts.append(data)
            return b"".join(parts)
        return data

    @property
    def length(self) -> int | None:
        """The body's declared length (``content-length``), or None when not declared."""
        declared = self.headers.get("content-length")
        return int(declared) if declared is not None and declared.isdigit() else None

    def close(self) -> None:
        if self._done:
            return
        self._done = True
        conn = self._conn
        if conn.reusable() and not conn.body:
            self._client.put_back(self._key, conn)
        else:
            conn.abort()


class UpstreamClient:
    """Kept-alive connections per origin (no limit on how many; an idle one is closed after
    ``keepalive_seconds``), and one POST at a time on each."""

    def __init__(self, keepalive_seconds: float = 30.0) -> None:
        self._keepalive = keepalive_seconds
        self._idle: dict[Origin, deque[_Connection]] = {}
        self._tls: ssl.SSLContext | None = None
        self._closed = False

    def idle_connections(self, origin: Origin) -> list[_Connection]:
        """The connections to ``origin`` waiting for a request (for tests and metrics)."""
        return list(self._idle.get(origin, ()))

    async def post(
        self,
        origin: Origin,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        connect_timeout: float | None,
        read_timeout: float | None,
    ) -> UpstreamResponse:
        """Send the request and wait for the answer's status and headers (each wait for the
        server at most ``read_timeout`` seconds)."""
        head = [
            b"POST ",
            (origin.base_path + path).encode(),
            b" HTTP/1.1\r\nhost: ",
            origin.host_header,
        ]
        head.append(b"\r\ncontent-length: %d\r\n" % len(body))
        for name, value in headers.items():
            head.append(f"{name}: {value}\r\n".encode("latin-1"))
        head += (b"\r\n", body)
        message = b"".join(head)  # head and body in one buffer, copied once
        while True:
            conn = self._take(origin)
            if conn is None:
                conn = await self._connect(origin, connect_timeout)
            try:
                assert conn.transport is not None
                conn.in_use = True
                conn.transport.write(message)
                while not conn.headers_done:
                    if conn.error is not None:
                        raise conn.error
                    await conn.wait(read_timeout)
            except UpstreamDisconnected:
                conn.abort()
                if conn.reused and not conn.got_bytes:
                    continue  # closed while idle: the request never reached the server
                raise
            except BaseException:
                conn.abort()  # cancelled (the client left) or timed out: vLLM aborts
                raise
            return UpstreamResponse(conn, self, origin, read_timeout)

    def _take(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        if not idle:
            return None
        now = time.monotonic()
        while idle:
            conn = idle.pop()  # the most recently used: the likeliest to be open
            if conn.closed or conn.transport is None or conn.transport.is_closing():
                continue
            if now - conn.idle_since > self._keepalive:
                conn.abort()
                continue
            return conn
        return None

    def put_back(self, origin: Origin, conn: _Connection) -> None:
        if self._closed:
            conn.abort()
            return
        conn.recycle()
        idle = self._idle.setdefault(origin, deque())
        # Connections idle past their time are dropped from the old end as new ones come.
        now = time.monotonic()
        while idle and (idle[0].closed or now - idle[0].idle_since > self._keepalive):
            idle.popleft().abort()
        idle.append(conn)

    async def _connect(self, origin: Origin, seconds: float | None) -> _Connection:
        loop = asyncio.get_running_loop()
        tls: ssl.SSLContext | None = None
        if origin.tls:
            if self._tls is None:
                self._tls = ssl.create_default_context()
            tls = self._tls
        async with asyncio.timeout(seconds):
            _, conn = await loop.create_connection(
                _Connection,
                origin.host,
                origin.port,
                ssl=tls,
                server_hostname=origin.host if tls else None,
            )
        return conn

    def close(self) -> None:
        """Close every idle connection; answers still being read end with theirs."""
        self._closed = True
        for idle in self._idle.values():
            while idle:
                idle.pop().abort()
        self._idle.clear()
