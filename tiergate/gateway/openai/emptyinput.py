"""Well-formed but empty inputs, refused with OpenAI's 400 before they reach an engine.

vLLM answers some of them with a 500 (an assistant message with empty ``content`` in a
Responses input: ``list index out of range``), others only after a round trip to an engine
that counts them as a failure; OpenAI refuses each of them as ``empty_array`` or
``empty_string`` naming the field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tiergate.gateway.errors import OpenAIError


def _empty(param: str, value: object) -> OpenAIError:
    kind = "array" if isinstance(value, list) else "string"
    return OpenAIError(
        400,
        f"Invalid '{param}': empty {kind}. Expected a value with minimum length 1.",
        param=param,
        code=f"empty_{kind}",
    )


def _items(param: str, value: object) -> list[tuple[str, Any]]:
    """A list field's items, each with its own ``param``; 400 when the list is empty."""
    if not isinstance(value, list):
        return []
    if not value:
        raise _empty(param, value)
    return [(f"{param}[{i}]", part) for i, part in enumerate(value)]


def _messages(body: dict[str, Any]) -> None:
    _items("messages", body.get("messages"))


def _prompt(body: dict[str, Any]) -> None:
    for param, part in _items("prompt", body.get("prompt")):
        if part == []:  # an empty list of token ids
            raise _empty(param, part)


def _input(body: dict[str, Any]) -> None:
    value = body.get("input")
    if value == "":
        raise _empty("input", value)
    for param, part in _items("input", value):
        if part in ("", []):
            raise _empty(param, part)


def _responses_input(body: dict[str, Any]) -> None:
    for param, item in _items("input", body.get("input")):
        if not isinstance(item, dict) or "role" not in item:
            continue  # function calls and their outputs carry no content
        content = item.get("content")
        # vLLM indexes an assistant message's first content part; an empty list of parts
        # is nothing to say for any role.
        if content == [] or (content == "" and item.get("role") == "assistant"):
            raise _empty(f"{param}.content", content)


_CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "/v1/chat/completions": _messages,
    "/v1/completions": _prompt,
    "/v1/responses": _responses_input,
    "/v1/embeddings": _input,
}


def refuse_empty_input(path: str, body: dict[str, Any]) -> None:
    """Raise the 400 for a route's empty input (routes without a check pass)."""
    check = _CHECKS.get(path)
    if check is not None:
        check(body)
