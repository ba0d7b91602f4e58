"""The client connection's writes of one pass of the event loop leave in one send.

uvicorn writes a response's head and its body in two ``transport.write`` calls, so every
answer cost two sends, two TCP segments and, on loopback or a local network, two wakeups
of the reader. A send on loopback also carries the receiver's side of TCP in the sender's
time: the head's write alone was about 8% of a proxied request's CPU at saturation
(py-spy, AMD EPYC). Here the writes made in one pass of the event loop are joined and
sent when the pass ends (one ``call_soon``): a non-streamed answer leaves in one send, and
a stream's head goes out with its first chunk if the chunk is there in the same pass.

Nothing waits longer than the pass that wrote it, nor past ``FLUSH_AT_BYTES`` held, and
order is kept: every write, close and abort of the connection goes through the same
buffer. A failing send (the peer gone) is the transport's to report, as before, to the
protocol's ``connection_lost``.

The protocol also bounds the time a request's headers take to arrive
(``gateway.header_read_timeout_seconds``), which uvicorn does not: its keep-alive timer is
armed only after a response and cancelled by any byte received, so a connection that
sends nothing, or its headers byte by byte, was held open until the client closed it. One
timer per request: armed when the connection is made and when a response completes with
no request queued behind it, disarmed when a request's headers are complete, cancelled
when the connection is lost. Firing, it closes the connection, with no answer (as nginx
does on its ``client_header_timeout``): no response is in progress then, and a client
that is half way through a request's head has nothing to read one from.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

# Held bytes past which a write goes out at once: uvicorn checks the transport's flow
# control (paused above its high-water mark, 64 KiB) before each write, and a producer
# that writes a lot in one pass must meet it as before, not pile its writes up here.
FLUSH_AT_BYTES = 64 * 1024
# gateway.header_read_timeout_seconds's default, for the protocol built without one.
HEADER_READ_TIMEOUT_SECONDS = 10.0


class CoalescingTransport:
    """A transport's stand-in that holds the writes of the current pass of the loop."""

    __slots__ = ("_held", "_loop", "_pending", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] | None = None
        self._held = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if self._pending is None:
            self._pending = [bytes(data)]
            self._held = len(data)
            self._loop.call_soon(self.flush)
        else:
            self._pending.append(bytes(data))
            self._held += len(data)
        if self._held >= FLUSH_AT_BYTES:
            self.flush()  # the callback already scheduled then finds nothing

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        pending, self._pending, self._held = self._pending, None, 0
        if not pending or self._transport.is_closing():
            return
        self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self) -> None:
        self.flush()  # what was written before the close still leaves, then the FIN
        self._transport.close()

    def abort(self) -> None:
        self._pending, self._held = None, 0
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        held = self._held if self._pending else 0
        return self._transport.get_write_buffer_size() + held

    def __getattr__(self, name: str) -> Any:
        # Everything else (is_closing, get_extra_info, pause/resume_reading, ...) is the
        # transport's own.
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol over a :class:`CoalescingTransport`, each request's
    headers due within ``header_read_timeout`` seconds."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        header_read_timeout: float = HEADER_READ_TIMEOUT_SECONDS,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.header_read_timeout = header_read_timeout
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        coalescing = CoalescingTransport(transport, self.loop)  # type: ignore[arg-type]
        super().connection_made(coalescing)  # type: ignore[arg-type]
        self._arm_header_timer()

    def on_headers_complete(self) -> None:
        self._disarm_header_timer()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        # A request queued behind this one (pipelined) has its headers already and starts
        # now: then no timer until its own response.
        idle = not self.pipeline
        super().on_response_complete()
        if idle and not self.transport.is_closing():
            self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        self._disarm_header_timer()
        self._header_timer = self.loop.call_later(
            self.header_read_timeout, self._header_read_timed_out
        )

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_read_timed_out(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()
