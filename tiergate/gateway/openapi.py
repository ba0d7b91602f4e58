"""The gateway's OpenAPI description of what it reads and what it answers.

The handlers read raw bodies (speed, and every field they do not act on passes through to
vLLM untouched), so the request and response shapes are declared here for the schema.
"""

from __future__ import annotations

from typing import Any

from tiergate.tiers import ACCEPTED_WORDS

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

_COMMON_FIELDS: dict[str, Any] = {
    "model": {"type": "string", "minLength": 1},
    "service_tier": {"type": "string", "enum": list(ACCEPTED_WORDS)},
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "max_tokens": {"type": "integer", "minimum": 1},
}

CHAT_REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["model", "messages"],
    "additionalProperties": True,
    "properties": {
        **_COMMON_FIELDS,
        "messages": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["role", "content"],
                "properties": {
                    "role": {"type": "string", "enum": ["system", "user", "assistant"]},
                    "content": {"type": "string"},
                },
            },
        },
    },
}

COMPLETION_REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["model", "prompt"],
    "additionalProperties": True,
    "properties": {**_COMMON_FIELDS, "prompt": {"type": "string"}},
}

_COMPLETION_RESPONSE: dict[str, Any] = {
    "type": "object",
    "required": ["id", "object", "choices"],
    "properties": {
        "id": {"type": "string"},
        "object": {"type": "string"},
        "choices": {"type": "array"},
        "service_tier": {"type": "string", "enum": ["default", "priority"]},
        "usage": {"type": ["object", "null"]},
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


def completion_route(request_schema: dict[str, Any]) -> dict[str, Any]:
    """``openapi_extra`` and ``responses`` for a completions route."""
    return {
        "openapi_extra": {
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": request_schema}},
            }
        },
        "responses": {
            200: {
                "description": "The completion (JSON), or Server-Sent Events when streaming",
                "content": {
                    "application/json": {"schema": _COMPLETION_RESPONSE},
                    # One schema per event: `data:` carries a chunk's JSON, an error envelope
                    # after a mid-stream failure, or `[DONE]`.
                    "text/event-stream": {
                        "schema": {
                            "type": "object",
                            "required": ["data"],
                            "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
                        }
                    },
                },
            },
            **error_responses(),
        },
    }


MODEL_CARD: dict[str, Any] = {
    "type": "object",
    "required": ["id", "object", "owned_by", "tiers"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "model"},
        "owned_by": {"type": "string"},
        "tiers": {"type": "array", "items": {"enum": ["standard", "fast"]}},
    },
}

MODEL_LIST: dict[str, Any] = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": MODEL_CARD}},
}


def json_response(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}
