"""Noticing a client that goes away while its request waits (for admission, for the
engine's answer), so that the wait is cancelled and the engine aborts the request."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected during a :meth:`DisconnectWatch.race`."""


class DisconnectWatch:
    """Cancels the request's own task when the client goes away during a :meth:`race`, which
    closes the upstream connection and makes vLLM abort the request. One watcher task per
    request and no extra task per await: this sits on the hot path.

    The watcher task starts only once the request has waited ``WATCH_AFTER_SECONDS``: most
    answers come sooner and then cost a timer handle instead of a task (its creation,
    wait and cancellation were about 5% of a proxied request's CPU). A client gone
    earlier is still noticed then: the disconnect waits in ``receive``."""

    WATCH_AFTER_SECONDS = 0.002

    def __init__(self, request: Request) -> None:
        self._request = request
        self._owner = asyncio.current_task()
        self._watcher: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._gone = False

    async def race(self, work: Awaitable[T]) -> T:
        if self._watcher is None and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(
                self.WATCH_AFTER_SECONDS, self._start
            )
        try:
            return await work
        except asyncio.CancelledError:
            if self._gone and self._owner is not None:
                self._owner.uncancel()
                raise ClientGone from None
            raise

    def _start(self) -> None:
        self._timer = None
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._wait())

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None

    async def _wait(self) -> None:
        while True:
            message = await self._request.receive()
            if message["type"] == "http.disconnect":
                self._gone = True
                if self._owner is not None:
                    self._owner.cancel()
                return
