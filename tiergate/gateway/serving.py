"""How the gateway is served: uvicorn's options from the settings, and the body deadline.

What bounds a slow or idle client:

- A request body (``gateway.body_read_timeout_seconds``): the whole body must arrive
  within the timeout after the request's headers, else 408 (:class:`BodyReadDeadline`).
- An idle keep-alive connection (``gateway.keep_alive_seconds``): uvicorn closes it when no
  new request starts within the timeout after the previous response.
- How many at once (``gateway.max_connections``, uvicorn's ``limit_concurrency``): past it,
  a request whose headers have arrived is answered 503 and its connection closed. Unset,
  it is derived from the process's open-file limit (:func:`connection_cap`): a cap is
  always there, since past the descriptors it has a server cannot accept anything, the
  health checks included.
- Request headers (``gateway.header_read_timeout_seconds``): a request's headers must be
  complete within the timeout after the connection is made, or, for the next request on
  a kept-alive connection, after the previous response; else the connection is closed,
  with no answer. uvicorn has no such timeout (its keep-alive timer is cancelled by any
  byte received, so a connection that sends nothing, or its headers byte by byte, was
  held open for good); the gateway's protocol keeps one timer per request for it
  (:class:`~tiergate.gateway.openai.coalesce.CoalescingHttpToolsProtocol`). A proxy in front
  may bound headers too (nginx's ``client_header_timeout``); this one holds without it.
"""

from __future__ import annotations

import asyncio
import functools
import resource
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tiergate.gateway.errors import OpenAIError
from tiergate.gateway.openai.coalesce import CoalescingHttpToolsProtocol
from tiergate.settings import GatewaySettings


def uvicorn_options(gateway: GatewaySettings) -> dict[str, Any]:
    """The keyword arguments for ``uvicorn.run``/``uvicorn.Config`` besides the app, host
    and port; used by ``tiergate serve`` and the local stack.

    The event loop and HTTP parser are named rather than left to uvicorn's "auto" (which
    falls back to asyncio and h11, several times slower per request, when uvloop or
    httptools is missing): both are dependencies of the gateway, and a missing one fails
    at start instead of silently costing throughput. The protocol is uvicorn's httptools
    one over a transport that sends a response's head and body in one write, with the
    header read timeout (:mod:`tiergate.gateway.openai.coalesce`); a ``functools.partial`` of
    the class, which uvicorn calls as it would the class, and which pickles (``--workers``
    sends the options to spawned processes).

    uvicorn's proxy-headers middleware is off: it rewrites the client address from
    ``X-Forwarded-For`` on every request (about 2% of a proxied request's CPU), and the
    gateway never reads the client address; forwarded headers stay in the request as
    sent."""
    return {
        "loop": "uvloop",
        "http": functools.partial(
            CoalescingHttpToolsProtocol, header_read_timeout=gateway.header_read_timeout_seconds
        ),
        "timeout_graceful_shutdown": gateway.shutdown_grace_seconds,
        "limit_concurrency": connection_cap(gateway),
        "timeout_keep_alive": gateway.keep_alive_seconds,
        "log_config": None,
        "access_log": False,
        "proxy_headers": False,
        "server_header": False,
    }


# The most connections a replica takes unless set: beyond a few thousand, more replicas.
MOST_CONNECTIONS = 8192


def connection_cap(gateway: GatewaySettings) -> int:
    """``gateway.max_connections``, or half of this process's soft open-file limit (a
    proxied request holds the client's descriptor and the engine's), at most
    :data:`MOST_CONNECTIONS`, and at least 64."""
    if gateway.max_connections is not None:
        return gateway.max_connections
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MOST_CONNECTIONS
    return max(64, min(MOST_CONNECTIONS, soft // 2))


def body_timeout_error(seconds: float) -> OpenAIError:
    return OpenAIError(
        408,
        f"The request body did not arrive within {seconds:g} seconds.",
        code="request_timeout",
        # The rest of the body may still be on its way: the connection cannot be reused.
        headers={"connection": "close"},
    )


class BodyReadDeadline:
    """ASGI middleware: reading an HTTP request's body past ``seconds`` after the request
    began raises a 408 :class:`OpenAIError` from ``receive``, which the route's error
    handling turns into the response. Once the body is complete, ``receive`` (then only
    waiting for a disconnect) is passed through untouched."""

    def __init__(self, app: ASGIApp, seconds: float) -> None:
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # One timer per request, armed here and disarmed when the body is complete (the
        # hot path: a timeout context per receive cost about 5% of a proxied request's
        # CPU). Firing while the request's task waits in ``receive``, it cancels that wait,
        # which ``receive`` turns into the 408; firing at any other time, it only marks
        # the deadline passed, and the next ``receive`` before the body is complete
        # raises the 408.
        loop = asyncio.get_running_loop()
        owner = asyncio.current_task()
        read = _BodyRead()

        def expire() -> None:
            read.timer = None
            read.expired = True
            if read.waiting and owner is not None:
                read.cancelled = True
                owner.cancel()

        read.timer = loop.call_at(loop.time() + self.seconds, expire)

        async def bounded_receive() -> Message:
            if read.complete:
                return await receive()
            if read.expired:
                raise body_timeout_error(self.seconds)
            if asyncio.current_task() is not owner:
                # Only the request's own task is cancelled by the timer; another one
                # waits on a timeout of its own.
                remaining = max(read.deadline(loop) - loop.time(), 0.0)
                try:
                    async with asyncio.timeout(remaining):
                        message = await receive()
                except TimeoutError:
                    raise body_timeout_error(self.seconds) from None
            else:
                read.waiting = True
                try:
                    message = await receive()
                except asyncio.CancelledError:
                    if read.cancelled and owner is not None:
                        read.cancelled = False
                        owner.uncancel()
                        raise body_timeout_error(self.seconds) from None
                    raise
                finally:
                    read.waiting = False
            if message["type"] != "http.request" or not message.get("more_body", False):
                read.complete = True
                read.disarm()
            return message

        try:
            await self.app(scope, bounded_receive, send)
        finally:
            read.disarm()


class _BodyRead:
    """Where one request's body read stands against its deadline."""

    __slots__ = ("cancelled", "complete", "expired", "timer", "waiting")

    def __init__(self) -> None:
        self.timer: asyncio.TimerHandle | None = None
        self.complete = False
        self.expired = False
        self.waiting = False
        self.cancelled = False

    def deadline(self, loop: asyncio.AbstractEventLoop) -> float:
        return self.timer.when() if self.timer is not None else loop.time()

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
