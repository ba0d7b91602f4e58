"""A client's x-request-id is echoed, never an identity; the engines' API key reaches vLLM
on every request and probe, and a refused engine key is not the client's fault."""

from __future__ import annotations

import asyncio
import itertools
import re
from typing import Any

import httpx

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.fault.helpers import metric_value
from tests.servers import gateway_settings, running_gateway
from tiergate.gateway.access.auth import new_key
from tiergate.gateway.openai.requestids import INTERNAL_ID_HEADER

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
SAME_ID = "client-chosen-id-1"


async def _twice_at_once(base: str, headers: dict[str, str]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=10) as client:
        return list(
            await asyncio.gather(
                *(
                    client.post(f"{base}/v1/chat/completions", json=CHAT, headers=headers)
                    for _ in range(2)
                )
            )
        )


def test_reused_request_id_does_not_slip_past_max_concurrent(fakes: list[FakeVllm]) -> None:
    key, digest = new_key()
    auth: dict[str, Any] = {
        "enabled": True,
        "keys": [{"name": "app", "hash": digest, "limits": {"max_concurrent": 1}}],
    }
    fakes[0].behaviour.chunk_delay = 0.8  # the first holds its slot while the second comes
    settings = gateway_settings([fakes[0].url], [fakes[2].url], auth=auth)
    with running_gateway(settings) as base:
        headers = {"authorization": f"Bearer {key}", "x-request-id": SAME_ID}
        answers = asyncio.run(_twice_at_once(base, headers))
        assert sorted(r.status_code for r in answers) == [200, 429]
        refused = next(r for r in answers if r.status_code == 429)
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert all(r.headers["x-request-id"] == SAME_ID for r in answers)
        # The slot is free again afterwards.
        assert httpx.post(f"{base}/v1/chat/completions", json=CHAT, headers=headers).is_success
    assert fakes[0].record.requests == 2


def test_a_cookie_an_engine_sets_reaches_no_other_request(fakes: list[FakeVllm]) -> None:
    """The gateway's one upstream client is shared by every caller: a cookie one answer
    sets (a sticky load balancer's, an engine's) must not ride along on the next
    caller's request, nor reach the caller."""
    fakes[0].behaviour.set_cookie = "route=engine-a; Path=/"
    # By name, as engines are found in a cluster (aiohttp keeps no cookie of a bare IP).
    by_name = fakes[0].url.replace("127.0.0.1", "localhost")
    with running_gateway(gateway_settings([by_name], [fakes[2].url])) as base:
        answers = [httpx.post(f"{base}/v1/chat/completions", json=CHAT) for _ in range(3)]
        assert all(r.status_code == 200 for r in answers)
        assert all("set-cookie" not in r.headers for r in answers)
    assert len(fakes[0].record.headers) == 3
    assert all("cookie" not in h for h in fakes[0].record.headers)


def test_same_client_id_reaches_vllm_as_distinct_ids(fakes: list[FakeVllm]) -> None:
    fakes[0].behaviour.chunk_delay = 0.5  # both are running on the engine at once
    with running_gateway(gateway_settings([fakes[0].url], [fakes[2].url])) as base:
        answers = asyncio.run(_twice_at_once(base, {"x-request-id": SAME_ID}))
        assert [r.status_code for r in answers] == [200, 200]
        assert [r.headers["x-request-id"] for r in answers] == [SAME_ID, SAME_ID]
        internal = {r.headers["x-tiergate-request-id"] for r in answers}
        sent = {h["x-request-id"] for h in fakes[0].record.headers}
        assert len(sent) == 2 and SAME_ID not in sent
        assert sent == internal
        # Without a client id the response carries the gateway's own.
        plain = httpx.post(f"{base}/v1/chat/completions", json=CHAT)
        assert plain.headers["x-request-id"] == plain.headers["x-tiergate-request-id"]
        assert plain.headers["x-request-id"] == fakes[0].record.headers[-1]["x-request-id"]
        # An id that is not a short printable one is not echoed.
        odd = httpx.post(
            f"{base}/v1/chat/completions", json=CHAT, headers={"x-request-id": "x" * 300}
        )
        assert odd.headers["x-request-id"] == odd.headers["x-tiergate-request-id"]


def test_engine_api_key_on_completions_and_probes(fakes: list[FakeVllm]) -> None:
    for fake, key in ((fakes[0], "std-engine-key"), (fakes[2], "fast-engine-key")):
        fake.behaviour.api_key = key
    settings = gateway_settings(
        [fakes[0].url],
        [fakes[2].url],
        tiers={
            "standard": {"endpoints": [fakes[0].url], "api_key": "std-engine-key"},
            "fast": {"endpoints": [fakes[2].url], "api_key": "fast-engine-key"},
        },
    )
    assert "std-engine-key" not in repr(settings)
    with running_gateway(settings) as base:
        for tier in ("default", "priority"):
            resp = httpx.post(f"{base}/v1/chat/completions", json={**CHAT, "service_tier": tier})
            assert resp.status_code == 200, resp.text
        streamed = httpx.post(
            f"{base}/v1/completions", json={"model": MODEL, "prompt": "x", "stream": True}
        )
        assert streamed.status_code == 200
        assert [m["id"] for m in httpx.get(f"{base}/v1/models").json()["data"]] == [MODEL]
        assert "engine-key" not in httpx.get(f"{base}/metrics").text
    std = "Bearer std-engine-key"
    assert [h["authorization"] for h in fakes[0].record.headers] == [std, std]
    assert [h["authorization"] for h in fakes[2].record.headers] == ["Bearer fast-engine-key"]
    for fake, expected in ((fakes[0], std), (fakes[2], "Bearer fast-engine-key")):
        paths = {path for path, _ in fake.record.probes}
        assert paths == {"/health", "/metrics", "/v1/models", "/openapi.json"}
        assert {auth for _, auth in fake.record.probes} == {expected}


def test_refused_engine_key_is_a_gateway_error(fakes: list[FakeVllm]) -> None:
    fakes[0].behaviour.api_key = "the-right-key"
    tiers = {
        "standard": {"endpoints": [fakes[0].url], "api_key": "a-wrong-key"},
        "fast": {"endpoints": [fakes[2].url]},
    }
    settings = gateway_settings(
        [fakes[0].url], [fakes[2].url], tiers=tiers, policy={"fallback": False}
    )
    with running_gateway(settings) as base:
        resp = httpx.post(f"{base}/v1/chat/completions", json=CHAT)
        assert resp.status_code == 502
        assert resp.json()["error"]["code"] == "upstream_auth_failed"
        assert "a-wrong-key" not in resp.text
        # Not an endpoint failure: the endpoint stays in the pool.
        assert metric_value(base, "tiergate_endpoint_healthy", tier="standard") == 1


def test_request_ids_say_nothing_of_other_callers_traffic(fakes: list[FakeVllm]) -> None:
    """Attacker's test: the gateway's ids were a per-process counter, returned even on a
    401, so anyone could measure the replica's request rate by sending two requests
    around other tenants' traffic. Ids are random now: no two are near each other."""
    key, digest = new_key()
    auth: dict[str, Any] = {"enabled": True, "keys": [{"name": "app", "hash": digest}]}
    settings = gateway_settings([fakes[0].url], [fakes[2].url], auth=auth)
    with running_gateway(settings) as base:
        ids = []
        for i in range(20):
            headers = {"authorization": f"Bearer {key if i % 2 else 'tg-wrong'}"}
            answer = httpx.post(f"{base}/v1/chat/completions", json=CHAT, headers=headers)
            assert answer.status_code == (200 if i % 2 else 401)
            ids.append(answer.headers[INTERNAL_ID_HEADER])
    assert all(re.fullmatch(r"req_[0-9a-f]{24}", i) for i in ids), ids
    assert len(set(ids)) == len(ids)
    numbers = [int(i[4:], 16) for i in ids]
    assert all(abs(a - b) > 1 << 40 for a, b in itertools.pairwise(numbers)), ids
