"""Reading what the gateway acts on from a request body: model, stream, tier, prefix."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import Request

from tiergate.gateway.errors import OpenAIError
from tiergate.tiers import ACCEPTED_WORDS, Tier, UnknownTierError, parse_requested_tier

TIER_HEADER = "x-tiergate-tier"

# Sampling features vLLM's speculative path refuses (vllm/sampling_params.py,
# _validate_spec_decode, and the logits-processor builder).
_SPEC_REFUSED = ("min_p", "logit_bias", "logits_processors")


@dataclass(slots=True)
class TierChoice:
    tier: Tier
    reason: str  # requested | header | auto | capability


@dataclass(slots=True)
class InspectedRequest:
    body: dict[str, Any]
    model: str
    stream: bool
    wants_usage: bool
    choice: TierChoice
    fast_compatible: bool
    prefix_key: int | None
    prompt_chars: int
    allowed_tiers: frozenset[Tier] = frozenset(Tier)
    long_prompt: bool = False

    @property
    def explicit_tier(self) -> bool:
        return self.choice.reason in ("requested", "header")


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed ``limit``
    (from Content-Length, or while reading a chunked body)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
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


def _requested(body: dict[str, Any], header: str | None) -> tuple[Tier | None, str]:
    field = body.get("service_tier")
    if field is not None and not isinstance(field, str):
        raise OpenAIError(400, "service_tier must be a string.", param="service_tier")
    try:
        # The body field wins; the header serves clients that cannot set the field.
        if field is not None and field.strip().lower() != "auto":
            return parse_requested_tier(field), "requested"
        if header:
            tier = parse_requested_tier(header)
            if tier is not None:
                return tier, "header"
    except UnknownTierError as exc:
        param = "service_tier" if field is not None else TIER_HEADER
        raise OpenAIError(
            400,
            f"Unknown service tier {exc.args[0]!r}; use one of {', '.join(ACCEPTED_WORDS)}.",
            param=param,
            code="invalid_service_tier",
        ) from None
    return None, "auto"


def prompt_texts(body: dict[str, Any]) -> list[str]:
    """The prompt's text parts: message contents (chat) or the prompt (completions)."""
    messages = body.get("messages")
    if isinstance(messages, list):
        parts = []
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if content is not None:
                parts.append(
                    content if isinstance(content, str) else orjson.dumps(content).decode()
                )
        return parts
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list):
        return [p if isinstance(p, str) else orjson.dumps(p).decode() for p in prompt]
    return []


def prefix_key(parts: list[str], chars: int) -> int | None:
    """A key for the leading part of the prompt, for prefix-cache affinity."""
    if not parts:
        return None
    return hash("\x00".join(parts)[:chars])


def _check_max_tokens(body: dict[str, Any], limit: int) -> None:
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is None:
            continue
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
    auto_tier: Tier,
    prefix_chars: int,
    max_tokens_limit: int = 1 << 30,
) -> InspectedRequest:
    """Validate the fields the gateway reads and decide the tier; the rest is vLLM's."""
    body = parse_body(raw)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise OpenAIError(400, "model is required and must be a string.", param="model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise OpenAIError(400, "stream must be a boolean.", param="stream")
    options = body.get("stream_options")
    wants_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    _check_max_tokens(body, max_tokens_limit)
    tier, reason = _requested(body, tier_header)
    if tier is None:
        tier = auto_tier
    compatible = fast_compatible(body)
    parts = prompt_texts(body)
    if tier is Tier.FAST and not compatible:
        tier, reason = Tier.STANDARD, "capability"
    return InspectedRequest(
        body=body,
        model=model,
        stream=stream,
        wants_usage=wants_usage,
        choice=TierChoice(tier, reason),
        fast_compatible=compatible,
        prefix_key=prefix_key(parts, prefix_chars),
        prompt_chars=sum(len(p) for p in parts),
    )


def upstream_body(req: InspectedRequest) -> bytes:
    """The body sent to vLLM: the client's, less ``service_tier`` (the gateway's business),
    with usage requested on streams so that tokens are always counted."""
    body = dict(req.body)
    body.pop("service_tier", None)
    if req.stream and not req.wants_usage:
        options = dict(body.get("stream_options") or {})
        options["include_usage"] = True
        body["stream_options"] = options
    return orjson.dumps(body)
