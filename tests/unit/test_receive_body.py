"""The hot path's body read from ASGI messages: whole, in pieces, too large, cut short."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.requests import ClientDisconnect

from tiergate.gateway.errors import OpenAIError
from tiergate.gateway.openai.selection import receive_body


def _receive(*messages: dict[str, Any]) -> Any:
    queue = list(messages)

    async def receive() -> dict[str, Any]:
        return queue.pop(0)

    return receive


def _part(body: bytes, more: bool) -> dict[str, Any]:
    return {"type": "http.request", "body": body, "more_body": more}


def test_one_message_and_several_pieces_read_the_same() -> None:
    whole = asyncio.run(receive_body(_receive(_part(b'{"a": 1}', False)), "8", 100))
    pieces = asyncio.run(
        receive_body(
            _receive(_part(b'{"a"', True), _part(b"", True), _part(b": 1}", False)), None, 100
        )
    )
    assert whole == pieces == b'{"a": 1}'


@pytest.mark.parametrize(
    ("messages", "declared"),
    [
        ([_part(b"x" * 101, False)], None),
        ([_part(b"x" * 60, True), _part(b"x" * 60, True), _part(b"x", False)], None),
        ([_part(b"x" * 60, True), _part(b"x" * 60, False)], None),
        ([_part(b"x", False)], "101"),
    ],
)
def test_a_body_over_the_limit_is_413(messages: list[dict[str, Any]], declared: str | None) -> None:
    with pytest.raises(OpenAIError) as caught:
        asyncio.run(receive_body(_receive(*messages), declared, 100))
    assert caught.value.status == 413


def test_a_client_gone_mid_body_is_a_disconnect() -> None:
    with pytest.raises(ClientDisconnect):
        asyncio.run(
            receive_body(_receive(_part(b"{", True), {"type": "http.disconnect"}), None, 100)
        )
    with pytest.raises(ClientDisconnect):
        asyncio.run(receive_body(_receive({"type": "http.disconnect"}), None, 100))
