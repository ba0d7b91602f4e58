"""Reading a relayed JSON answer's usage from its last bytes."""

from __future__ import annotations

import orjson

from tiergate.gateway.openai.relay import usage_in_tail


def test_usage_is_read_from_the_answers_end() -> None:
    usage = {"prompt_tokens": 7, "total_tokens": 7, "prompt_tokens_details": {"cached": 0}}
    answer = orjson.dumps({"data": [{"embedding": [0.5] * 2000}], "usage": usage})
    assert usage_in_tail(answer[-4096:]) == usage


def test_no_usage_or_a_cut_one_is_none() -> None:
    assert usage_in_tail(b'{"count": 3, "tokens": [1, 2, 3]}') is None
    assert usage_in_tail(b'"usage": {"prompt_tokens": 3, "total_') is None
