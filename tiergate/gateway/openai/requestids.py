"""Request ids: the gateway's own per request, and the client's, which is only echoed.

A client's ``x-request-id`` is echoed and logged but never used as an identity: reusing
one must not let two requests share a concurrency lease, nor reach vLLM (which refuses to
run a request id twice at once) as one.
"""

from __future__ import annotations

import itertools
import uuid

REQUEST_ID_HEADER = "x-request-id"
INTERNAL_ID_HEADER = "x-tiergate-request-id"
_MAX_CLIENT_ID_CHARS = 256


class RequestIds:
    """Unique request ids: a random per-process prefix and a counter (cheaper than uuid4)."""

    def __init__(self) -> None:
        self._prefix = f"req_{uuid.uuid4().hex[:12]}"
        self._count = itertools.count(1)

    def next(self) -> str:
        return f"{self._prefix}{next(self._count):012x}"


def client_request_id(value: str | None) -> str | None:
    """The client's ``x-request-id`` when it is one worth echoing and logging: at most
    256 printable ASCII characters (anything else is dropped, not echoed)."""
    if not value or len(value) > _MAX_CLIENT_ID_CHARS:
        return None
    return value if value.isascii() and value.isprintable() else None
