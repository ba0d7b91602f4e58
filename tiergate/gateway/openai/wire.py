"""The proxied request's few headers as the gateway reads them, and its JSON answer as the
gateway writes it: the hot path's two ends, without Starlette's per-header scans."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from tiergate.gateway.access.auth import ON_BEHALF_OF
from tiergate.gateway.openai.requestids import REQUEST_ID_HEADER
from tiergate.gateway.openai.selection import TIER_HEADER


class JSONAnswer(Response):
    """A 200 JSON answer with the headers the gateway wrote (lower-case names, neither
    content-type nor content-length among them): Response without its header scan.

    ``after``: the request's bookkeeping (metrics, the access log line), run once the
    answer is handed to the connection, in a callback of its own: the client's answer
    does not wait for it. The connection's send of this pass of the loop
    (:mod:`tiergate.gateway.openai.coalesce`) was scheduled first, so it goes out before."""

    media_type = "application/json"

    def __init__(
        self, body: bytes, headers: dict[str, str], after: Callable[[], None] | None = None
    ) -> None:
        self.status_code = 200
        self.background = None
        self.body = body
        self.after = after
        raw = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]
        raw.append((b"content-length", b"%d" % len(body)))
        raw.append((b"content-type", b"application/json"))
        self.raw_headers = raw

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            await send({"type": "http.response.body", "body": self.body})
        finally:
            if self.after is not None:
                asyncio.get_running_loop().call_soon(self.after)


_WANTED = {
    name.encode(): name
    for name in (
        REQUEST_ID_HEADER,
        "authorization",
        ON_BEHALF_OF,
        TIER_HEADER,
        "content-length",
    )
}


def wanted_headers(raw: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """The headers the gateway reads, as ``request.headers.get`` gives them (names are
    lower-case in ASGI; the first of repeated ones; latin-1)."""
    found: dict[str, str] = {}
    for name, value in raw:
        key = _WANTED.get(name)
        if key is not None and key not in found:
            found[key] = value.decode("latin-1")
    return found
