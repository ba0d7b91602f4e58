"""Reading what the gateway acts on from a request body: model, stream, the asked tier,
the prompt's size and prefix. The tier itself is decided by
:mod:`tiergate.gateway.access.policy`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive

from tiergate.gateway.access.policy import AskedTier, Needs, Reason
from tiergate.gateway.errors import OpenAIError
from tiergate.gateway.openai.assemble import assembles
from tiergate.gateway.openai.emptyinput import refuse_empty_input
from tiergate.gateway.openai.routes import ROUTES, Route
from tiergate.tiers import (
    ACCEPTED_WORDS,
    UnknownTierError,
    is_flex,
    parse_requested_tier,
    urgency_of,
)

TIER_HEADER = "x-tiergate-tier"

# Sampling features vLLM's speculative path refuses (vllm/sampling_params.py,
# _validate_spec_decode, and the logits-processor builder).
_SPEC_REFUSED = ("min_p", "logit_bias", "logits_processors")


@dataclass(frozen=True, slots=True)
class InspectedRequest:
    body: dict[str, Any]
    route: Route
    model: str
    stream: bool
    wants_usage: bool
    asked: AskedTier
    fast_compatible: bool
    prefix_key: int | None
    prompt_chars: int
    # Non-streamed, but asked of the engine as a stream and assembled by the gateway
    # (tiergate.gateway.openai.assemble), so that time-outs measure liveness, not length.
    assembled: bool = False
    # The tenant's vLLM cache_salt on a generation route (tiergate.gateway.access.cachesalt).
    cache_salt: str | None = None

    @property
    def needs(self) -> Needs:
        return Needs(self.route.path, self.fast_compatible)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed ``limit``
    (from Content-Length, or while reading a chunked body)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():  # a body the framework already read comes first
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def receive_body(receive: Receive, declared: str | None, limit: int) -> bytes:
    """:func:`read_body` from the ASGI ``receive`` and the declared Content-Length: the
    proxied routes' hot path reads the body without a Request's header map and stream."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    message = await receive()
    body: bytes = message.get("body", b"")
    if message["type"] == "http.request" and not message.get("more_body", False):
        if len(body) > limit:  # the usual case: the whole body in one message
            raise _too_large(limit)
        return body
    chunks = [body]
    size = len(body)
    while message["type"] == "http.request" and message.get("more_body", False):
        if size > limit:
            raise _too_large(limit)
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        chunks.append(chunk)
    if message["type"] == "http.disconnect":
        raise ClientDisconnect()
    if size > limit:
        raise _too_large(limit)
    return b"".join(chunks)


def _too_large(limit: int) -> OpenAIError:
    return OpenAIError(413, f"The request body exceeds {limit} bytes.", code="request_too_large")


def parse_body(raw: bytes) -> dict[str, Any]:
    if not raw:
        raise OpenAIError(400, "The request body is empty; a JSON object is required.")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise OpenAIError(
            400, f"The request body is not valid JSON: {exc}", code="invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise OpenAIError(400, "The request body must be a JSON object.", code="invalid_json")
    return body


def fast_compatible(body: dict[str, Any]) -> bool:
    """False when the speculative (fast) engine would refuse the request's sampling options."""
    for name in _SPEC_REFUSED:
        value = body.get(name)
        if name == "min_p":
            if isinstance(value, int | float) and value > 0:
                return False
        elif value:
            return False
    return True


def requested_tier(field: object, header: str | None = None) -> AskedTier:
    """The tier a caller asks for: the body's ``service_tier`` (``field``), else the tier
    header; ``auto`` or nothing asks for none. The one reading of the word, for requests
    and jobs alike; an unknown word is a 400 naming the accepted ones."""
    if field is not None and not isinstance(field, str):
        raise OpenAIError(400, "service_tier must be a string.", param="service_tier")
    try:
        # The body field wins; the header serves clients that cannot set the field.
        if field is not None and field.strip().lower() != "auto":
            tier = parse_requested_tier(field)
            return AskedTier(tier, Reason.REQUESTED, urgency_of(field), is_flex(field))
        if header:
            tier = parse_requested_tier(header)
            if tier is not None:
                return AskedTier(tier, Reason.HEADER, urgency_of(header), is_flex(header))
    except UnknownTierError as exc:
        param = "service_tier" if field is not None else TIER_HEADER
        raise OpenAIError(
            400,
            f"Unknown service tier {exc.args[0]!r}; use one of {', '.join(ACCEPTED_WORDS)}.",
            param=param,
            code="invalid_service_tier",
        ) from None
    return AskedTier(None)


def prompt_texts(body: dict[str, Any], path: str = "/v1/chat/completions") -> list[str]:
    """The prompt's text parts, where the route keeps them."""
    return ROUTES[path].prompt(body)


def prefix_key(parts: list[str], chars: int, salt: str | None = None) -> int | None:
    """A key for the leading part of the prompt, for prefix-cache affinity: with the
    tenant's cache salt, since a prefix cached under another salt is no hit."""
    if not parts:
        return None
    return hash((salt, "\x00".join(parts)[:chars]))


def _check_max_tokens(body: dict[str, Any], names: tuple[str, ...], limit: int) -> None:
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        # JSON has one number type: 16.0 is the integer 16 (as for vLLM's validation).
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise OpenAIError(400, f"{name} must be an integer.", param=name)
        if value > limit:
            raise OpenAIError(
                400,
                f"{name} is {value}; this gateway allows at most {limit}.",
                param=name,
                code="max_tokens_too_large",
            )


def inspect(
    raw: bytes,
    tier_header: str | None,
    prefix_chars: int,
    max_tokens_limit: int = 1 << 30,
    route: Route | None = None,
    cache_salt: str | None = None,
) -> InspectedRequest:
    """Validate the fields the gateway reads; the rest is vLLM's. ``cache_salt``: the
    caller's tenant's, sent on the routes that take one (:attr:`Route.salted`)."""
    route = route or ROUTES["/v1/chat/completions"]
    body = parse_body(raw)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise OpenAIError(400, "model is required and must be a string.", param="model")
    stream = False
    if route.streams:
        stream = body.get("stream", False)
        if stream is None:
            stream = False
        if not isinstance(stream, bool):
            raise OpenAIError(400, "stream must be a boolean.", param="stream")
    options = body.get("stream_options")
    wants_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    _check_max_tokens(body, route.max_token_fields, max_tokens_limit)
    refuse_empty_input(route.path, body)
    parts = route.prompt(body)
    assembled = not stream and route.asks_stream_usage and assembles(body)
    salt = cache_salt if route.salted else None
    return InspectedRequest(
        body=body,
        route=route,
        model=model,
        stream=stream,
        wants_usage=wants_usage,
        asked=requested_tier(body.get("service_tier"), tier_header),
        fast_compatible=not route.sampling or fast_compatible(body),
        prefix_key=prefix_key(parts, prefix_chars, salt),
        prompt_chars=sum(len(p) for p in parts),
        assembled=assembled,
        cache_salt=salt,
    )


def upstream_body(req: InspectedRequest, engine_priority: int | None = None) -> bytes:
    """The body sent to vLLM: the client's, less ``service_tier`` and ``priority`` (the
    gateway's business: a caller never sets its own place in the engine's queue), with
    ``engine_priority`` as vLLM's ``priority`` when the engines schedule by it, the
    tenant's ``cache_salt`` in place of any the caller sent, and usage
    requested on streams so that tokens are always counted; an assembled request is sent
    as a stream."""
    body = dict(req.body)
    body.pop("service_tier", None)
    body.pop("priority", None)
    if engine_priority is not None:
        body["priority"] = engine_priority
    if req.cache_salt is not None:
        body["cache_salt"] = req.cache_salt
    if req.assembled:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    elif req.stream and req.route.asks_stream_usage and not req.wants_usage:
        options = dict(body.get("stream_options") or {})
        options["include_usage"] = True
        body["stream_options"] = options
    return orjson.dumps(body)
