"""Request ids: the gateway's own per request, and the client's, which is only echoed.

A client's ``x-request-id`` is echoed and logged but never used as an identity: reusing
one must not let two requests share a concurrency lease, nor reach vLLM (which refuses to
run a request id twice at once) as one.

The gateway's ids are random: a counter, returned to every caller (on a 401 too), would
let anyone measure how many requests the replica's other tenants send.
"""

from __future__ import annotations

import secrets

REQUEST_ID_HEADER = "x-request-id"
INTERNAL_ID_HEADER = "x-tiergate-request-id"
_MAX_CLIENT_ID_CHARS = 256


class RequestIds:
    """Unique, unpredictable request ids: 96 random bits each (about 1 us)."""

    def next(self) -> str:
        return f"req_{secrets.token_hex(12)}"


def client_request_id(value: str | None) -> str | None:
    """The client's ``x-request-id`` when it is one worth echoing and logging: at most
    256 printable ASCII characters (anything else is dropped, not echoed)."""
    if not value or len(value) > _MAX_CLIENT_ID_CHARS:
        return None
    return value if value.isascii() and value.isprintable() else None
