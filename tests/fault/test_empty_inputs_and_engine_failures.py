"""Inputs the engine would crash on are the gateway's 400, and an engine that fails with a
5xx once retries and fallback are spent is the gateway's 502: both in OpenAI's envelope,
neither naming an engine's address."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.servers import gateway_settings, running_gateway
from tiergate.gateway.errors import from_upstream

EMPTY: list[tuple[str, dict[str, Any], str, str]] = [
    ("/v1/chat/completions", {"messages": []}, "messages", "empty_array"),
    ("/v1/completions", {"prompt": []}, "prompt", "empty_array"),
    ("/v1/completions", {"prompt": [[1, 2], []]}, "prompt[1]", "empty_array"),
    ("/v1/embeddings", {"input": []}, "input", "empty_array"),
    ("/v1/embeddings", {"input": ""}, "input", "empty_string"),
    ("/v1/embeddings", {"input": ["a", ""]}, "input[1]", "empty_string"),
    ("/v1/responses", {"input": []}, "input", "empty_array"),
    (
        "/v1/responses",
        {"input": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": []}]},
        "input[1].content",
        "empty_array",
    ),
    (
        "/v1/responses",
        {"input": [{"type": "message", "role": "assistant", "content": ""}]},
        "input[0].content",
        "empty_string",
    ),
]


@pytest.mark.parametrize(("path", "fields", "param", "code"), EMPTY)
def test_empty_input_is_refused_before_the_engine(
    fakes: list[FakeVllm], path: str, fields: dict[str, Any], param: str, code: str
) -> None:
    with running_gateway(gateway_settings([fakes[0].url], [fakes[2].url])) as base:
        resp = httpx.post(f"{base}{path}", json={"model": MODEL, **fields})
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert (error["type"], error["param"], error["code"]) == (
            "invalid_request_error",
            param,
            code,
        )
    assert fakes[0].record.requests == fakes[2].record.requests == 0


def test_inputs_that_are_not_empty_still_reach_the_engine(fakes: list[FakeVllm]) -> None:
    with running_gateway(gateway_settings([fakes[0].url], [fakes[2].url])) as base:
        chat = {"model": MODEL, "messages": [{"role": "assistant", "content": ""}]}
        assert httpx.post(f"{base}/v1/chat/completions", json=chat).status_code == 200
        turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
        responses = {"model": MODEL, "input": turns}
        assert httpx.post(f"{base}/v1/responses", json=responses).status_code == 200


def test_an_engine_failing_with_500_everywhere_is_a_502(fakes: list[FakeVllm]) -> None:
    for fake in fakes:
        fake.behaviour.mode = "status"
        fake.behaviour.status = 500
    settings = gateway_settings(
        [fakes[0].url, fakes[1].url], [fakes[2].url], health={"eject_after_failures": 100}
    )
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    with running_gateway(settings) as base:
        resp = httpx.post(f"{base}/v1/chat/completions", json=chat)
        assert resp.status_code == 502, resp.text
        error = resp.json()["error"]
        assert error["type"] == "server_error" and error["code"] == "upstream_error"
        assert "HTTP 500" in error["message"] and "fake failure 500" in error["message"]
        assert not any(fake.url.split("//")[1] in resp.text for fake in fakes)
    # Retried and fallen back before answering: every engine was asked.
    assert all(fake.record.requests >= 1 for fake in fakes)


def test_an_engine_message_loses_its_addresses() -> None:
    raw = b'{"error": {"message": "connect to http://10.0.0.7:8000/v1 failed", "code": 500}}'
    err = from_upstream(500, raw)
    assert err.status == 502 and "10.0.0.7" not in err.message and "<engine>" in err.message
    # 503 (overloaded, not ready) and 504 keep their meaning.
    assert from_upstream(503, b"{}").status == 503
    assert from_upstream(504, b"{}").status == 504
