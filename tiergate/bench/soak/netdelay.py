"""A TCP proxy on loopback that can be made slow: the soak puts it between the gateways
and workers and the object store, and its "slow network" fault sets a delay before every
chunk it forwards (both ways) for a while. In-process (a thread with its own event loop),
so it needs no tool and no privilege."""

from __future__ import annotations

import asyncio
import contextlib
import threading

from tiergate.measure.ports import free_port
from tiergate.measure.wait import wait_until

_CHUNK = 65536


class DelayProxy:
    """``127.0.0.1:{port}`` forwards to ``127.0.0.1:{upstream}``; :attr:`delay` seconds
    (0: none) pass before each chunk goes on."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.port = free_port()
        self.delay = 0.0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True, name="soak-delay-proxy")
        self._ready = threading.Event()
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> DelayProxy:
        self._thread.start()
        if not wait_until(self._ready.is_set, 10, 0.05):
            raise RuntimeError("the store's delay proxy did not start")
        return self

    def stop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self.port)
        )
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        except OSError:  # the store is down: the client sees its connection closed
            writer.close()
            return
        await asyncio.gather(
            self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True
        )

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while chunk := await src.read(_CHUNK):
                if self.delay > 0:
                    await asyncio.sleep(self.delay)
                dst.write(chunk)
                await dst.drain()
        except OSError:
            pass
        finally:
            with contextlib.suppress(Exception):
                dst.close()
