"""What every wire model of the jobs API shares: refusing unknown fields and NUL bytes.

A NUL byte cannot reach a command line, a path or an argument of the sandbox, so a spec
that carries one is refused when it is submitted rather than failing on a worker later.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class Strict(BaseModel):
    """A request model: an unknown field is a caller's mistake, refused, never ignored."""

    model_config = {"extra": "forbid"}


def refuse_nul(value: Any, where: str) -> None:
    """Raise ``ValueError`` naming ``where`` if a string in ``value`` (a string, or dicts
    and lists of them) contains a NUL byte."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError(f"{where} contains a NUL byte")
    elif isinstance(value, dict):
        for k, v in value.items():
            refuse_nul(k, where)
            refuse_nul(v, where)
    elif isinstance(value, list):
        for item in value:
            refuse_nul(item, where)


def list_page(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """OpenAI's list envelope for a page of ``data`` (objects with an ``id``)."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }
