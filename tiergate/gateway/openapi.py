"""The gateway's OpenAPI description of what it reads and what it answers.

The handlers read raw bodies (speed, and every field they do not act on passes through to
vLLM untouched), so the request and response shapes are declared here for the description
only. They are generated, once per process, from typed models: the ``openai`` package's own
request and response types for the OpenAI routes, and :mod:`tiergate.gateway.openapi_models`
for vLLM's own routes. What the gateway itself adds is applied on top: ``model`` required,
``service_tier`` taking tiergate's words too, and the output-token fields bounded by
``gateway.max_tokens_limit`` (the gateway refuses more with 400, an installation limit).

The shared definitions live under ``components/schemas`` (:func:`install_components`); each
route's top-level request object is inline in its operation, since it carries the limit.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tiergate.gateway.openai.routes import ROUTES, Route, StreamEnd
from tiergate.tiers import ACCEPTED_WORDS, Tier

ERROR_ENVELOPE: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}

_ERROR_STATUSES = {
    "400": "Malformed JSON, a field the gateway reads is wrong, or vLLM refused the request",
    "401": "No API key, or a wrong one",
    "403": "The key may not use this model or tier",
    "404": "Unknown model",
    "408": "The body did not arrive within gateway.body_read_timeout_seconds",
    "413": "Body too large",
    "429": "The key's own limit (requests, tokens or concurrency)",
    "500": "Internal error",
    "502": "The upstream failed while answering, or refused the gateway's engine key",
    "503": "No healthy endpoint, or the tier's admission queue is full",
    "504": "The upstream did not answer in time",
}


def error_responses(*statuses: str) -> dict[int | str, dict[str, Any]]:
    chosen = statuses or tuple(_ERROR_STATUSES)
    return {
        status: {
            "description": _ERROR_STATUSES[status],
            "content": {"application/json": {"schema": ERROR_ENVELOPE}},
        }
        for status in chosen
    }


def error_response(description: str) -> dict[str, Any]:
    """One documented error answer in the OpenAI envelope, described as this route has it."""
    return {"description": description, "content": {"application/json": {"schema": ERROR_ENVELOPE}}}


# The tiers' names, in their order (tiergate/tiers.py), wherever the description lists them.
TIER_NAMES = tuple(tier.value for tier in Tier)

MODEL_CARD: dict[str, Any] = {
    "type": "object",
    "required": ["id", "object", "owned_by", "tiers"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "model"},
        "owned_by": {"type": "string"},
        "tiers": {"type": "array", "items": {"enum": list(TIER_NAMES)}},
        "tier_details": {
            "type": "array",
            "description": "What each serving tier runs: recipe, measured speedup, parity",
            "items": {
                "type": "object",
                "required": ["tier"],
                "properties": {
                    "tier": {"enum": list(TIER_NAMES)},
                    "service_tier": {"type": "string"},
                    "runs": {"type": "string"},
                },
            },
        },
    },
}

MODEL_LIST: dict[str, Any] = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": MODEL_CARD}},
}


def json_response(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


# -- the generated description of the ROUTES table -------------------------------------------

TIER_HEADER_PARAMETER: dict[str, Any] = {
    "name": "X-Tiergate-Tier",
    "in": "header",
    "required": False,
    "description": "The tier, for clients that cannot set service_tier (the field wins).",
    "schema": {"type": "string", "enum": list(ACCEPTED_WORDS)},
}

_REF_PREFIX = "#/components/schemas/"


@dataclass(frozen=True, slots=True)
class _Shapes:
    """What one route reads and answers, as typed models (names in openapi_models/openai)."""

    request: str
    response: str
    stream_event: str | None = None  # the JSON in a stream's `data:` lines
    binary: bool = False  # vLLM answers raw bytes for encoding_format bytes/bytes_only


_ROUTE_SHAPES: dict[str, _Shapes] = {
    "/v1/chat/completions": _Shapes(
        "ChatCompletionRequest", "ChatCompletion", "ChatCompletionChunk"
    ),
    "/v1/completions": _Shapes("CompletionRequest", "Completion", "CompletionChunk"),
    "/v1/responses": _Shapes("ResponseRequest", "Response", "ResponseStreamEvent"),
    "/v1/embeddings": _Shapes("EmbeddingRequest", "CreateEmbeddingResponse"),
    "/tokenize": _Shapes("TokenizeRequest", "TokenizeResponse"),
    "/detokenize": _Shapes("DetokenizeRequest", "DetokenizeResponse"),
    "/pooling": _Shapes("PoolingRequest", "PoolingResponse", binary=True),
    "/classify": _Shapes("ClassificationRequest", "ClassificationResponse"),
    "/score": _Shapes("ScoreRequest", "ScoreResponse"),
    "/v1/score": _Shapes("ScoreRequest", "ScoreResponse"),
    "/rerank": _Shapes("RerankRequest", "RerankResponse"),
    "/v1/rerank": _Shapes("RerankRequest", "RerankResponse"),
    "/v2/rerank": _Shapes("RerankRequest", "RerankResponse"),
}


@dataclass(frozen=True, slots=True)
class _Generated:
    components: dict[str, Any]  # name -> schema, refs as #/components/schemas/<name>
    requests: dict[str, Any]  # request type name -> its top-level schema (no gateway fields)
    responses: dict[str, Any]  # response/event type name -> a schema (usually a $ref)


def _types() -> dict[str, Any]:
    """Every type named in _ROUTE_SHAPES (imports the openai package: on first use only)."""
    from openai.types import Completion, CreateEmbeddingResponse
    from openai.types.chat import ChatCompletion, ChatCompletionChunk
    from openai.types.responses import Response, ResponseStreamEvent

    from tiergate.gateway import openapi_models as m

    return {
        "ChatCompletionRequest": m.ChatCompletionRequest,
        "CompletionRequest": m.CompletionRequest,
        "ResponseRequest": m.ResponseRequest,
        "EmbeddingRequest": m.EmbeddingRequest,
        "TokenizeRequest": m.TokenizeRequest,
        "DetokenizeRequest": m.DetokenizeRequest,
        "PoolingRequest": m.PoolingRequest,
        "ClassificationRequest": m.ClassificationRequest,
        "ScoreRequest": m.ScoreRequest,
        "RerankRequest": m.RerankRequest,
        "ChatCompletion": ChatCompletion,
        "ChatCompletionChunk": ChatCompletionChunk,
        "Completion": Completion,
        "CompletionChunk": m.CompletionChunk,
        "Response": Response,
        "ResponseStreamEvent": ResponseStreamEvent,
        "CreateEmbeddingResponse": CreateEmbeddingResponse,
        "TokenizeResponse": m.TokenizeResponse,
        "DetokenizeResponse": m.DetokenizeResponse,
        "PoolingResponse": m.PoolingResponse,
        "ClassificationResponse": m.ClassificationResponse,
        "ScoreResponse": m.ScoreResponse,
        "RerankResponse": m.RerankResponse,
    }


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def _camel(snake: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in snake.split("_"))


def _short_names(names: list[str]) -> dict[str, str]:
    """pydantic qualifies clashing names with the module path
    (``openai__types__chat__chat_completion__Choice``); shorten each to the fewest trailing
    module names that stay unique (``ChatCompletionChoice``)."""
    taken = {name for name in names if "__" not in name}
    renamed = {name: name for name in taken}
    for name in sorted(n for n in names if "__" in n):
        *modules, cls = name.split("__")
        chosen = name.replace("__", ".")
        for depth in range(1, len(modules) + 1):
            prefix = "".join(_camel(m) for m in modules[-depth:])
            candidate = prefix if prefix.endswith(cls) else prefix + cls
            if candidate not in taken:
                chosen = candidate
                break
        taken.add(chosen)
        renamed[name] = chosen
    return renamed


@functools.cache
def _generated() -> _Generated:
    """The JSON Schemas of every type, generated in one pass so that the definitions they
    share are named once."""
    from pydantic import TypeAdapter

    types = _types()
    keys, top = TypeAdapter.json_schemas(
        [(name, "validation", TypeAdapter(t)) for name, t in types.items()],
        ref_template=_REF_PREFIX + "{model}",
    )
    defs: dict[str, Any] = top.get("$defs", {})
    renamed = _short_names(list(defs))
    schemas = {name: keys[(name, "validation")] for name in types}
    tree = {"defs": {renamed[k]: v for k, v in defs.items()}, "schemas": schemas}
    for node in _walk(tree):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(_REF_PREFIX):
            node["$ref"] = _REF_PREFIX + renamed[ref[len(_REF_PREFIX) :]]
    components: dict[str, Any] = tree["defs"]
    # A request's own object is inlined in its operation (it gets the gateway's fields); the
    # definitions it is made of, which other schemas may share, stay in the components.
    requests = {
        name: _inline_top(schemas[name], components)
        for name in {s.request for s in _ROUTE_SHAPES.values()}
    }
    responses = {name: schemas[name] for name in types if name not in requests}
    tops = {ref[len(_REF_PREFIX) :] for name in requests for ref in _top_refs(schemas[name])}
    rest = {k: v for k, v in components.items() if k not in tops}
    still = {
        node["$ref"][len(_REF_PREFIX) :]
        for node in _walk([rest, requests, responses])
        if isinstance(node.get("$ref"), str)
    }
    for name in tops - still:
        del components[name]
    return _Generated(components, requests, responses)


def _top_refs(schema: dict[str, Any]) -> list[str]:
    """The $refs a request's top level is made of: itself, or each branch of a union."""
    if "$ref" in schema:
        return [schema["$ref"]]
    return [branch["$ref"] for branch in schema.get("anyOf", []) if "$ref" in branch]


def _inline_top(schema: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in schema:
        return copy.deepcopy(components[schema["$ref"][len(_REF_PREFIX) :]])
    if "anyOf" in schema:
        return {"anyOf": [_inline_top(branch, components) for branch in schema["anyOf"]]}
    return copy.deepcopy(schema)


def _objects(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The request objects of a top-level schema: itself, or each branch of a union."""
    return [b for b in schema["anyOf"]] if "anyOf" in schema else [schema]


_MODEL_FIELD: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "title": "Model",
    "description": "A model served by a tier (GET /v1/models); the gateway requires it.",
}

_SERVICE_TIER_FIELD: dict[str, Any] = {
    "anyOf": [{"type": "string", "enum": list(ACCEPTED_WORDS)}, {"type": "null"}],
    "title": "Service Tier",
    "description": (
        "OpenAI's words (auto, default, flex, scale, priority) or tiergate's (standard, fast): "
        "default, flex and scale are served by the standard tier, priority by the fast one. "
        "The gateway removes it before vLLM."
    ),
}


# The fields the gateway refuses empty (tiergate/gateway/openai/emptyinput.py), per route.
_NON_EMPTY = {
    "/v1/chat/completions": ("messages",),
    "/v1/completions": ("prompt",),
    "/v1/embeddings": ("input",),
    "/v1/responses": ("input",),
}


def _non_empty(node: Any) -> None:
    """Say in ``node`` (a field's schema, not into shared components) that arrays and
    strings in it hold at least one item or character."""
    if not isinstance(node, dict) or "$ref" in node:
        return
    if node.get("type") == "array":
        node["minItems"] = 1
        _non_empty(node.get("items"))
    elif node.get("type") == "string" and "enum" not in node and "const" not in node:
        node["minLength"] = 1
    for key in ("anyOf", "oneOf"):
        for option in node.get(key, []):
            _non_empty(option)


def _with_gateway_fields(schema: dict[str, Any], route: Route, limit: int) -> dict[str, Any]:
    schema = copy.deepcopy(schema)
    for obj in _objects(schema):
        props = obj.setdefault("properties", {})
        for name in _NON_EMPTY.get(route.path, ()):
            _non_empty(props.get(name))
        props["model"] = dict(_MODEL_FIELD)
        required = [name for name in obj.get("required", []) if name != "model"]
        obj["required"] = ["model", *required]
        props["service_tier"] = copy.deepcopy(_SERVICE_TIER_FIELD)
        for name in route.max_token_fields:
            props[name] = {
                "anyOf": [{"type": "integer", "maximum": limit}, {"type": "null"}],
                "title": name.replace("_", " ").title(),
                "description": (
                    f"At most {limit} here (gateway.max_tokens_limit): the gateway refuses "
                    "more with 400 max_tokens_too_large."
                ),
            }
    return schema


def _stream_event(data: dict[str, Any], named_events: bool) -> dict[str, Any]:
    """One Server-Sent Event, as OpenAPI 3.1 describes a stream's items (``schema`` is each
    event): ``data`` holds the JSON of one chunk, an error envelope after a mid-stream
    failure, or ``[DONE]`` (chat and completions only)."""
    json_data = {
        "type": "string",
        "contentMediaType": "application/json",
        "contentSchema": {"anyOf": [data, ERROR_ENVELOPE]},
    }
    event: dict[str, Any] = {
        "type": "object",
        "required": ["data"],
        "properties": {
            "data": json_data if named_events else {"anyOf": [{"const": "[DONE]"}, json_data]},
            "event": {"type": "string"},
            "id": {"type": "string"},
            "retry": {"type": "integer"},
        },
    }
    if named_events:
        event["properties"]["event"]["description"] = "The event's type, as in its data."
    return event


def route_doc(route: Route, max_tokens_limit: int) -> dict[str, Any]:
    """``openapi_extra`` and ``responses`` for one route of ROUTES, for ``app.post``; the
    description needs :func:`install_components` (done by :func:`add_model_examples`)."""
    shapes = _ROUTE_SHAPES[route.path]
    generated = _generated()
    request = _with_gateway_fields(generated.requests[shapes.request], route, max_tokens_limit)
    content: dict[str, Any] = {
        "application/json": {"schema": copy.deepcopy(generated.responses[shapes.response])}
    }
    if route.streams and shapes.stream_event is not None:
        data = copy.deepcopy(generated.responses[shapes.stream_event])
        content["text/event-stream"] = {
            "schema": _stream_event(data, route.stream_end is StreamEnd.RESPONSE)
        }
    if shapes.binary:
        content["application/octet-stream"] = {
            "schema": {"type": "string", "contentMediaType": "application/octet-stream"}
        }
    success = "The answer (JSON)"
    if route.streams:
        success += ", or Server-Sent Events when `stream` is true"
    return {
        "openapi_extra": {
            "summary": route.summary,
            "parameters": [dict(TIER_HEADER_PARAMETER)],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": request}},
            },
        },
        "responses": {200: {"description": success, "content": content}, **error_responses()},
    }


def install_components(schema: dict[str, Any]) -> None:
    """Put the generated definitions under the document's ``components/schemas``."""
    existing = schema.setdefault("components", {}).setdefault("schemas", {})
    for name, definition in _generated().components.items():
        if existing.get(name, definition) != definition:
            raise ValueError(f"components/schemas/{name} is defined twice, differently")
        existing[name] = definition


def add_model_examples(schema: dict[str, Any], names: list[str]) -> None:
    """Complete the description for the served models: the generated components installed,
    and ``names`` as the examples of ``model`` in every ROUTES request schema (so that a
    client, or a fuzzer, reading the description can reach the backends)."""
    install_components(schema)
    for path in ROUTES:
        operation = schema.get("paths", {}).get(path, {}).get("post")
        if operation is None:
            continue
        body = operation["requestBody"]["content"]["application/json"]["schema"]
        for obj in _objects(body):
            obj["properties"]["model"]["examples"] = list(names)
