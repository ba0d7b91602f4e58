"""Pool membership, readiness, fallback between tiers and request guards, on FakeVllm."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.fault.helpers import metric_value
from tests.servers import free_port, gateway_settings, running_gateway
from tests.waiting import eventually

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


def test_fast_tier_without_endpoints_falls_back_to_standard(fakes: list[FakeVllm]) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with running_gateway(gateway_settings([fakes[0].url], [dead])) as base:
        resp = httpx.post(f"{base}/v1/chat/completions", json={**CHAT, "service_tier": "priority"})
        assert resp.status_code == 200
        assert resp.json()["service_tier"] == "default"
        assert resp.headers["x-tiergate-tier"] == "standard"
        assert resp.headers["x-tiergate-fallback"] == "true"
        assert fakes[0].record.requests == 1
        assert metric_value(base, "tiergate_fallbacks_total", from_tier="fast") == 1
        ready = httpx.get(f"{base}/readyz")
        assert ready.status_code == 200
        assert ready.json()["tiers"] == {"standard": True, "fast": False}


def test_no_fallback_and_no_endpoint_is_503_envelope(fakes: list[FakeVllm]) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    settings = gateway_settings([fakes[0].url], [dead], policy={"fallback": False})
    with running_gateway(settings) as base:
        resp = httpx.post(f"{base}/v1/chat/completions", json={**CHAT, "service_tier": "fast"})
        assert resp.status_code == 503
        assert resp.json()["error"]["code"] == "no_healthy_endpoint"
        assert "retry-after" in resp.headers
        # Still ready (the pod serves its own routes); the body says the tiers cannot serve.
        ready = httpx.get(f"{base}/readyz")
        assert ready.status_code == 200
        assert ready.json() == {
            "ready": True,
            "tiers_serving": False,
            "tiers": {"standard": True, "fast": False},
        }


def test_endpoint_returning_after_outage_is_used_again(fakes: list[FakeVllm]) -> None:
    fakes[2].behaviour.healthy = False
    settings = gateway_settings([fakes[0].url], [fakes[2].url])
    with running_gateway(settings) as base:
        first = httpx.post(
            f"{base}/v1/completions", json={"model": MODEL, "prompt": "x", "service_tier": "fast"}
        )
        assert first.headers["x-tiergate-tier"] == "standard"
        fakes[2].behaviour.healthy = True
        eventually(
            lambda: metric_value(base, "tiergate_endpoint_healthy", endpoint=fakes[2].url) == 1,
            what="the fast endpoint healthy again",
        )
        again = httpx.post(
            f"{base}/v1/completions", json={"model": MODEL, "prompt": "x", "service_tier": "fast"}
        )
        assert again.headers["x-tiergate-tier"] == "fast"
        assert again.json()["service_tier"] == "priority"


def test_dns_discovery_finds_endpoints(fakes: list[FakeVllm]) -> None:
    dns = {"name": "localhost", "port": fakes[0].port, "refresh_seconds": 0.2}
    settings = gateway_settings(
        [], [], tiers={"standard": {"dns": dns}, "fast": {"endpoints": [fakes[2].url]}}
    )
    with running_gateway(settings) as base:
        resp = httpx.post(f"{base}/v1/chat/completions", json=CHAT)
        assert resp.status_code == 200
        assert fakes[0].record.requests == 1
        assert metric_value(base, "tiergate_endpoint_healthy", endpoint=fakes[0].url) == 1


def test_body_too_large_is_413(fakes: list[FakeVllm]) -> None:
    settings = gateway_settings([fakes[0].url], [fakes[2].url], gateway={"max_body_bytes": 2048})
    with running_gateway(settings) as base:
        big = {**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}
        resp = httpx.post(f"{base}/v1/chat/completions", json=big)
        assert resp.status_code == 413
        assert resp.json()["error"]["code"] == "request_too_large"

        def chunks():  # no content-length: the limit holds while reading
            yield b'{"model": "fake-model", "prompt": "'
            for _ in range(10):
                yield b"y" * 512
            yield b'"}'

        resp = httpx.post(f"{base}/v1/completions", content=chunks())
        assert resp.status_code == 413
        assert fakes[0].record.requests == 0


def test_bad_requests_get_the_envelope_and_reach_no_backend(fakes: list[FakeVllm]) -> None:
    with running_gateway(gateway_settings([fakes[0].url], [fakes[2].url])) as base:
        cases = [
            (b"{not json", 400, "invalid_json", None),
            (b"[1, 2]", 400, "invalid_json", None),
            (b'{"messages": []}', 400, None, "model"),
            (
                b'{"model": "nope", "messages": [{"role": "user", "content": "hi"}]}',
                404,
                "model_not_found",
                "model",
            ),
            # Well-formed but empty: vLLM would fail on it; the gateway refuses it itself.
            (b'{"model": "fake-model", "messages": []}', 400, "empty_array", "messages"),
            (
                b'{"model": "fake-model", "service_tier": "turbo"}',
                400,
                "invalid_service_tier",
                "service_tier",
            ),
            (b'{"model": "fake-model", "service_tier": 3}', 400, None, "service_tier"),
            (b'{"model": "fake-model", "stream": "yes"}', 400, None, "stream"),
        ]
        for body, status, code, param in cases:
            resp = httpx.post(f"{base}/v1/chat/completions", content=body)
            assert resp.status_code == status, body
            err = resp.json()["error"]
            assert set(err) == {"message", "type", "param", "code"}
            assert err["code"] == code and err["param"] == param, body
            assert err["message"]
        resp = httpx.post(
            f"{base}/v1/chat/completions", json=CHAT, headers={"x-tiergate-tier": "warp"}
        )
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "x-tiergate-tier"
        assert httpx.get(f"{base}/v1/nothing").json()["error"]["code"] == "not_found"
        assert fakes[0].record.requests == 0 and fakes[2].record.requests == 0


def test_models_are_listed_with_their_tiers(fakes: list[FakeVllm]) -> None:
    with running_gateway(gateway_settings([fakes[0].url], [fakes[2].url])) as base:
        listed = httpx.get(f"{base}/v1/models").json()
        assert listed["object"] == "list"
        assert [(m["id"], m["tiers"]) for m in listed["data"]] == [(MODEL, ["standard", "fast"])]
        assert httpx.get(f"{base}/v1/models/{MODEL}").json()["id"] == MODEL
        missing = httpx.get(f"{base}/v1/models/other")
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "model_not_found"


def test_stream_usage_is_hidden_unless_asked_and_counted_always(fakes: list[FakeVllm]) -> None:
    with running_gateway(gateway_settings([fakes[0].url], [fakes[2].url])) as base:
        plain = httpx.post(f"{base}/v1/chat/completions", json={**CHAT, "stream": True}).text
        assert '"usage"' not in plain and plain.endswith("data: [DONE]\n\n")
        assert fakes[0].record.bodies[-1]["stream_options"] == {"include_usage": True}
        assert "service_tier" not in fakes[0].record.bodies[-1]
        asked = httpx.post(
            f"{base}/v1/chat/completions",
            json={**CHAT, "stream": True, "stream_options": {"include_usage": True}},
        ).text
        assert '"completion_tokens": 5' in asked.replace('":', '": ')
        assert metric_value(base, "tiergate_completion_tokens_total", tier="standard") == 10
        assert "x-request-id" in httpx.post(f"{base}/v1/chat/completions", json=CHAT).headers


def test_tiers_endpoint_without_a_decision_says_so(fakes: list[FakeVllm]) -> None:
    with running_gateway(gateway_settings([fakes[0].url], [fakes[1].url])) as base:
        body = httpx.get(f"{base}/v1/tiers").json()
        assert body["decision"] is None
        assert [t["service_tier"] for t in body["data"]] == ["default", "priority"]
        assert "tiergate_tier_recipe_info" not in httpx.get(f"{base}/metrics").text


def test_engines_shared_by_both_tiers_both_take_a_standard_backlog(
    fakes: list[FakeVllm],
) -> None:
    """tuning.share_engines_when_equal: with the fast tier running the standard
    configuration, both tiers list both engines; eight concurrent standard requests then
    run on both instead of queueing on one while the other idles."""
    shared = [fakes[0].url, fakes[2].url]
    for fake in (fakes[0], fakes[2]):
        fake.behaviour.slots = 2
        fake.behaviour.delay_per_prompt_char = 0.05
    with running_gateway(gateway_settings(shared, shared[::-1])) as base:

        def one(_: int) -> int:
            body = {**CHAT, "service_tier": "default"}
            return httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30).status_code

        with ThreadPoolExecutor(8) as pool:
            assert list(pool.map(one, range(8))) == [200] * 8
        assert fakes[0].record.requests >= 2 and fakes[2].record.requests >= 2, (
            fakes[0].record.requests,
            fakes[2].record.requests,
        )
        tiers = httpx.get(f"{base}/v1/tiers").json()["data"]
        assert [t["engines"] for t in tiers] == ["shared by both tiers"] * 2
        assert all("engine_mode" not in t for t in tiers)  # not configured: not claimed
    modes = {"engine_modes": {"standard": "compiled", "fast": "eager"}}
    with running_gateway(gateway_settings([fakes[0].url], [fakes[2].url], gateway=modes)) as base:
        tiers = httpx.get(f"{base}/v1/tiers").json()["data"]
        assert [t["engines"] for t in tiers] == ["its own"] * 2
        assert [t["engine_mode"] for t in tiers] == ["compiled", "eager"]
