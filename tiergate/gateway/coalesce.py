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
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# Held bytes past which a write goes out at once: uvicorn checks the transport's flow
# control (paused above its high-water mark, 64 KiB) before each write, and a producer
# that writes a lot in one pass must meet it as before, not pile its writes up here.
FLUSH_AT_BYTES = 64 * 1024


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
    """uvicorn's httptools protocol over a :class:`CoalescingTransport`."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        coalescing = CoalescingTransport(transport, self.loop)  # type: ignore[arg-type]
        super().connection_made(coalescing)  # type: ignore[arg-type]
