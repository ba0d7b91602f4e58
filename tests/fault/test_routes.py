"""Every proxied route gets chat's treatment: tier choice, keys, limits, retries before the
first byte, metrics, the error envelope; and a route no engine serves is a clear error.
Over FakeVllm (a fake engine), so each can be made to fail."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.fault.helpers import metric_value
from tests.servers import gateway_settings, running_gateway
from tiergate.gateway.access.auth import new_key


@pytest.fixture
def pooling() -> Iterator[FakeVllm]:
    """A fake engine started for a pooling task: embeddings, score, rerank; no chat."""
    server = FakeVllm(pooling=True).start()
    yield server
    server.stop()


def _wait_routes(base: str, path: str, expected_status: int) -> httpx.Response:
    """Post until the gateway has learned the engines' routes (first health round)."""
    deadline = 50
    resp = httpx.post(f"{base}{path}", json={"model": MODEL, "input": "x"})
    while resp.status_code != expected_status and deadline:
        deadline -= 1
        httpx.get(f"{base}/health")
        resp = httpx.post(f"{base}{path}", json={"model": MODEL, "input": "x"})
    return resp


def test_responses_plain_and_streamed_echo_the_served_tier(fakes: list[FakeVllm]) -> None:
    with running_gateway(gateway_settings([fakes[0].url], [fakes[2].url])) as base:
        body = {"model": MODEL, "input": "hi", "service_tier": "priority"}
        plain = httpx.post(f"{base}/v1/responses", json=body)
        assert plain.status_code == 200, plain.text
        assert plain.json()["service_tier"] == "priority"
        assert plain.headers["x-tiergate-tier"] == "fast"
        # The gateway's word never reaches vLLM, which would refuse `fast`.
        assert "service_tier" not in fakes[2].record.bodies[-1]
        streamed = httpx.post(f"{base}/v1/responses", json={**body, "stream": True})
        assert streamed.status_code == 200
        events = [
            json.loads(line[len("data: ") :])
            for line in streamed.text.splitlines()
            if line.startswith("data: ")
        ]
        kinds = [e["type"] for e in events]
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        assert all(e["response"]["service_tier"] == "priority" for e in events if "response" in e)
        # No stream_options were added (the Responses API has none), and no error event.
        assert "stream_options" not in fakes[2].record.bodies[-1]
        assert "error" not in streamed.text
        assert metric_value(base, "tiergate_completion_tokens_total", tier="fast") >= 5


def test_truncated_responses_stream_ends_with_an_error_event(fakes: list[FakeVllm]) -> None:
    fakes[0].behaviour.mode = "truncate_stream"
    with running_gateway(gateway_settings([fakes[0].url], [fakes[2].url])) as base:
        resp = httpx.post(
            f"{base}/v1/responses", json={"model": MODEL, "input": "hi", "stream": True}
        )
        assert resp.status_code == 200
        # The Responses API's own error event, which its clients read by type.
        last = resp.text.strip().split("\n\n")[-1].splitlines()
        assert last[0] == "event: error"
        error = json.loads(last[1][len("data: ") :])
        assert error["type"] == "error" and error["code"] == "upstream_stream_broken"
        assert error["sequence_number"] > 0


def test_tokenize_round_trip_and_unserved_embeddings(fakes: list[FakeVllm]) -> None:
    with running_gateway(gateway_settings([fakes[0].url], [fakes[2].url])) as base:
        tokens = httpx.post(f"{base}/tokenize", json={"model": MODEL, "prompt": "hey"})
        assert tokens.status_code == 200 and tokens.headers["x-tiergate-tier"] == "standard"
        back = httpx.post(
            f"{base}/detokenize",
            json={"model": MODEL, "tokens": tokens.json()["tokens"], "service_tier": "fast"},
        )
        assert back.json() == {"prompt": "hey"} and back.headers["x-tiergate-tier"] == "fast"
        # Neither engine serves embeddings (generative fakes): said plainly, nothing sent.
        sent = fakes[0].record.requests + fakes[2].record.requests
        err = _wait_routes(base, "/v1/embeddings", 404)
        assert err.status_code == 404
        assert err.json()["error"]["code"] == "route_not_served"
        assert "/v1/embeddings" in err.json()["error"]["message"]
        assert fakes[0].record.requests + fakes[2].record.requests == sent


def test_embeddings_and_rerank_go_to_the_tier_that_serves_them(
    fakes: list[FakeVllm], pooling: FakeVllm
) -> None:
    # The standard tier runs a pooling engine, the fast tier a generative one.
    settings = gateway_settings([pooling.url], [fakes[2].url])
    with running_gateway(settings) as base:
        resp = _wait_routes(base, "/v1/embeddings", 200)
        assert resp.status_code == 200, resp.text
        assert resp.json()["data"][0]["embedding"] == [1.0, 0.5, -0.5]
        asked_fast = httpx.post(
            f"{base}/v1/embeddings", json={"model": MODEL, "input": "x", "service_tier": "fast"}
        )
        assert asked_fast.status_code == 200
        assert asked_fast.headers["x-tiergate-tier"] == "standard"
        assert asked_fast.headers["x-tiergate-tier-reason"] == "capability"
        rerank = httpx.post(
            f"{base}/v1/rerank", json={"model": MODEL, "query": "q", "documents": ["a", "b"]}
        )
        assert rerank.status_code == 200 and len(rerank.json()["results"]) == 2
        # And chat goes to the tier whose engine generates.
        chat = httpx.post(
            f"{base}/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert chat.status_code == 200 and chat.headers["x-tiergate-tier"] == "fast"
        assert (
            metric_value(base, "tiergate_requests_total", path="/v1/embeddings", status="200") == 2
        )


def test_an_engine_without_the_route_is_a_clear_error_not_a_bare_404(
    fakes: list[FakeVllm],
) -> None:
    # Engines that do not describe their routes: the request is sent, and the engine's
    # framework 404 comes back said plainly, in the envelope.
    for fake in (fakes[0], fakes[2]):
        fake.behaviour.describes_routes = False
    with running_gateway(gateway_settings([fakes[0].url], [fakes[2].url])) as base:
        resp = httpx.post(f"{base}/v1/score", json={"model": MODEL, "text_1": "a", "text_2": "b"})
        assert resp.status_code == 404
        error = resp.json()["error"]
        assert error["code"] == "route_not_served"
        assert error["message"] == "The standard tier's engine does not serve /v1/score."


def test_retries_keys_and_limits_apply_to_every_route(fakes: list[FakeVllm]) -> None:
    key, digest = new_key()
    fakes[0].behaviour.mode = "status"
    fakes[0].behaviour.status = 503
    settings = gateway_settings(
        [fakes[0].url, fakes[1].url],
        [fakes[2].url],
        auth={
            "enabled": True,
            "keys": [
                {
                    "name": "app",
                    "hash": digest,
                    "tiers": ["standard"],
                    "limits": {"requests_per_minute": 2},
                }
            ],
        },
    )
    auth = {"authorization": f"Bearer {key}"}
    with running_gateway(settings) as base:
        assert (
            httpx.post(f"{base}/tokenize", json={"model": MODEL, "prompt": "a"}).status_code == 401
        )
        fast = httpx.post(
            f"{base}/tokenize",
            json={"model": MODEL, "prompt": "a", "service_tier": "fast"},
            headers=auth,
        )
        assert fast.status_code == 403 and fast.json()["error"]["code"] == "tier_not_allowed"
        # The first standard endpoint answers 503: retried on the second before any byte.
        for _ in range(2):
            ok = httpx.post(f"{base}/tokenize", json={"model": MODEL, "prompt": "a"}, headers=auth)
            assert ok.status_code == 200, ok.text
        assert fakes[1].record.requests == 2
        limited = httpx.post(
            f"{base}/v1/responses", json={"model": MODEL, "input": "a"}, headers=auth
        )
        assert limited.status_code == 429
        assert limited.json()["error"]["code"] == "rate_limit_exceeded"
