"""How the gateway is served: uvicorn's options from the settings, and the body deadline.

What bounds a slow or idle client, and what does not:

- A request body (``gateway.body_read_timeout_seconds``): the whole body must arrive
  within the timeout after the request's headers, else 408 (:class:`BodyReadDeadline`).
- An idle keep-alive connection (``gateway.keep_alive_seconds``): uvicorn closes it when no
  new request starts within the timeout after the previous response.
- How many at once (``gateway.max_connections``, uvicorn's ``limit_concurrency``): past it,
  a request whose headers have arrived is answered 503 and its connection closed.
- Not covered here: request headers. uvicorn (h11 or httptools) has no header read
  timeout, and arms its keep-alive timer only after a response, so a fresh connection
  that sends nothing, or its headers byte by byte, is held open until the client closes
  it. Such connections count against ``max_connections``; bounding them in time is left
  to the proxy in front (an Ingress controller's client header timeout, e.g. nginx's
  ``client_header_timeout``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tiergate.gateway.errors import OpenAIError
from tiergate.settings import GatewaySettings


def uvicorn_options(gateway: GatewaySettings) -> dict[str, Any]:
    """The keyword arguments for ``uvicorn.run``/``uvicorn.Config`` besides the app, host
    and port; used by ``tiergate serve`` and the local stack."""
    return {
        "timeout_graceful_shutdown": gateway.shutdown_grace_seconds,
        "limit_concurrency": gateway.max_connections,
        "timeout_keep_alive": gateway.keep_alive_seconds,
        "log_config": None,
        "access_log": False,
    }


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
        deadline = time.monotonic() + self.seconds
        complete = False

        async def bounded_receive() -> Message:
            nonlocal complete
            if complete:
                return await receive()
            remaining = deadline - time.monotonic()
            try:
                # A timer handle rather than wait_for's extra task: this is the hot path.
                async with asyncio.timeout(max(remaining, 0.0)):
                    message = await receive()
            except TimeoutError:
                raise body_timeout_error(self.seconds) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                complete = True
            return message

        await self.app(scope, bounded_receive, send)
