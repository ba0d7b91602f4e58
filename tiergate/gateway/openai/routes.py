"""The vLLM routes the gateway serves through the tiers, and what each one needs.

One table, so that every route gets the same treatment (keys, limits, tier choice, retries
before the first byte, metrics, the error envelope) and differs only where its protocol
does: where the prompt is, whether it streams, how a stream ends, whether the answer echoes
``service_tier``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from tiergate.tiers import Tier, served_word


class RouteKind(StrEnum):
    GENERATE = "generate"  # sampling: the fast tier's speculative engine may refuse options
    POOLING = "pooling"  # embeddings, scores: an engine started for a pooling task
    TOKENIZER = "tokenizer"  # no model run at all


class StreamEnd(StrEnum):
    DONE = "done"  # chat and completions: `data: [DONE]`
    RESPONSE = "response"  # the Responses API: a `response.completed` (or failed) event


def echo_tier(answer: dict[str, Any], tier: Tier, flex: bool = False) -> None:
    """The served tier written into an answer object (a completion, a stream's chunk, a
    response): OpenAI's ``service_tier``, as the tier's OpenAI word, or ``flex`` for the
    flex lane (tiergate.tiers.served_word). The one place the echo is written; which
    routes echo is the table's ``echoes_tier``."""
    answer["service_tier"] = served_word(tier, flex)


def _dumps(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def _messages_or_prompt(body: dict[str, Any]) -> list[str]:
    messages = body.get("messages")
    if isinstance(messages, list):
        parts = []
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if content is not None:
                parts.append(_dumps(content))
        return parts
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list):
        return [_dumps(p) for p in prompt]
    return []


def _responses_input(body: dict[str, Any]) -> list[str]:
    parts = [body["instructions"]] if isinstance(body.get("instructions"), str) else []
    value = body.get("input")
    if isinstance(value, str):
        parts.append(value)
    elif isinstance(value, list):
        parts.extend(_dumps(item) for item in value)
    return parts


def _input_field(body: dict[str, Any]) -> list[str]:
    value = body.get("input")
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [_dumps(item) for item in value]
    return _messages_or_prompt(body)


def _query_documents(body: dict[str, Any]) -> list[str]:
    parts = []
    for name in ("query", "text_1", "queries", "documents", "text_2", "data_1", "data_2"):
        value = body.get(name)
        if value is not None:
            parts.append(_dumps(value))
    return parts


def _tokens(body: dict[str, Any]) -> list[str]:
    tokens = body.get("tokens")
    return [" " * len(tokens)] if isinstance(tokens, list) else []


@dataclass(frozen=True, slots=True)
class Route:
    path: str
    kind: RouteKind
    summary: str
    prompt: Callable[[dict[str, Any]], list[str]]
    streams: bool = False
    stream_end: StreamEnd = StreamEnd.DONE
    # The answer carries OpenAI's `service_tier` (chat, completions, responses).
    echoes_tier: bool = False
    # The fields that bound the output, checked against gateway.max_tokens_limit.
    max_token_fields: tuple[str, ...] = ()
    # Usage is asked of vLLM on streams (`stream_options.include_usage`), to count tokens.
    asks_stream_usage: bool = False

    @property
    def sampling(self) -> bool:
        return self.kind is RouteKind.GENERATE

    @property
    def salted(self) -> bool:
        """Its requests carry the tenant's ``cache_salt`` (tiergate.gateway.access.cachesalt):
        every route that runs the model, since a pooling engine may cache prefixes too
        (vLLM takes the field on both kinds, and ignores a field a request does not
        model)."""
        return self.kind is not RouteKind.TOKENIZER


_OUTPUT = ("max_tokens", "max_completion_tokens")
# What the chat and the legacy completions routes share.
_COMPLETIONS: dict[str, Any] = dict(
    streams=True, echoes_tier=True, max_token_fields=_OUTPUT, asks_stream_usage=True
)

ROUTES: dict[str, Route] = {
    r.path: r
    for r in (
        Route(
            "/v1/chat/completions",
            RouteKind.GENERATE,
            "OpenAI chat completions",
            _messages_or_prompt,
            **_COMPLETIONS,
        ),
        Route(
            "/v1/completions",
            RouteKind.GENERATE,
            "OpenAI (legacy) completions",
            _messages_or_prompt,
            **_COMPLETIONS,
        ),
        Route(
            "/v1/responses",
            RouteKind.GENERATE,
            "OpenAI Responses API (stateless: vLLM keeps no responses by default)",
            _responses_input,
            streams=True,
            stream_end=StreamEnd.RESPONSE,
            echoes_tier=True,
            max_token_fields=("max_output_tokens",),
        ),
        Route("/v1/embeddings", RouteKind.POOLING, "OpenAI embeddings", _input_field),
        Route("/tokenize", RouteKind.TOKENIZER, "vLLM: a prompt's tokens", _messages_or_prompt),
        Route("/detokenize", RouteKind.TOKENIZER, "vLLM: tokens back to text", _tokens),
        Route("/pooling", RouteKind.POOLING, "vLLM: raw pooler output", _input_field),
        Route("/classify", RouteKind.POOLING, "vLLM: classification", _input_field),
        Route("/score", RouteKind.POOLING, "vLLM: pair scores", _query_documents),
        Route("/v1/score", RouteKind.POOLING, "vLLM: pair scores", _query_documents),
        Route("/rerank", RouteKind.POOLING, "Jina/Cohere-style rerank", _query_documents),
        Route("/v1/rerank", RouteKind.POOLING, "Jina/Cohere-style rerank", _query_documents),
        Route("/v2/rerank", RouteKind.POOLING, "Cohere v2 rerank", _query_documents),
    )
}
