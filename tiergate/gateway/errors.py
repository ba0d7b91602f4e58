"""OpenAI's error envelope, for the gateway's own refusals and for vLLM's errors."""

from __future__ import annotations

import re
from typing import Any

import orjson
from starlette.responses import Response

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


def error_type_for(status: int) -> str:
    return _TYPE_BY_STATUS.get(status, "server_error" if status >= 500 else "invalid_request_error")


class OpenAIError(Exception):
    """A refusal that reaches the client as ``{"error": {...}}`` with an HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        type_: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type_ or error_type_for(status)
        self.headers = headers or {}

    def envelope(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def to_response(self, headers: dict[str, str] | None = None) -> Response:
        return Response(
            orjson.dumps(self.envelope()),
            status_code=self.status,
            media_type="application/json",
            headers={**self.headers, **(headers or {})},
        )


# An address in an engine's message (its own URL, a peer's): not for callers to see.
_URL = re.compile(r"\b(?:https?|tcp|grpc)://[^\s'\"<>]+", re.IGNORECASE)


def from_upstream(status: int, body: bytes) -> OpenAIError:
    """Normalise a vLLM error body (integer ``code``, exception-class ``type``, or the older
    flat ``{"object": "error", ...}`` shape) into OpenAI's envelope, keeping its message
    less any address in it. An engine that failed (a 5xx, when no retry or fallback could
    serve the request) is the gateway's 502 ``upstream_error``, not a relayed 500: the
    request reached a server that broke, which is not the gateway's own fault; 503 (the
    engine is overloaded or unready) and 504 keep their meaning."""
    message = f"upstream returned HTTP {status}"
    param: str | None = None
    code: str | None = None
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict):
        inner = data.get("error", data)
        if isinstance(inner, dict):
            message = str(inner.get("message") or message)
            raw_param = inner.get("param")
            param = raw_param if isinstance(raw_param, str) else None
            raw_code = inner.get("code")
            code = raw_code if isinstance(raw_code, str) else None
        elif isinstance(inner, str):
            message = inner
    elif body:
        message = body.decode("utf-8", "replace")[:500]
    if code is None and status == 404 and "model" in message.lower():
        code = "model_not_found"
    message = _URL.sub("<engine>", message)
    if status >= 500 and status not in (503, 504):
        message = f"The engine failed (HTTP {status}): {message}" if status != 502 else message
        return OpenAIError(502, message, code=code or "upstream_error", param=param)
    return OpenAIError(status, message, code=code, param=param)


def sse_error_event(message: str, code: str, type_: str = "server_error") -> bytes:
    """An error after the 200 has gone out travels as one ``data:`` event."""
    err = OpenAIError(502, message, code=code, type_=type_)
    return b"data: " + orjson.dumps(err.envelope()) + b"\n\n"
