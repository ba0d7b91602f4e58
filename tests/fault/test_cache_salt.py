"""Tenants cannot time each other's prompts through the engines' prefix cache: every
generation request reaches vLLM with its tenant's own ``cache_salt``, whatever the caller
sent (tiergate.gateway.access.cachesalt). A real gateway over fake vLLM servers that
record the bodies they are sent."""

from __future__ import annotations

from typing import Any

import httpx

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.servers import gateway_settings, running_gateway
from tiergate.gateway.access.auth import new_key

PREFIX = "You are the assistant of ACME's legal team. The merger with Initech closes on"
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": PREFIX}]},
    "/v1/completions": {"prompt": PREFIX},
    "/v1/responses": {"input": PREFIX},
}


def test_two_tenants_identical_prefixes_hit_different_cache_salts(
    fakes: list[FakeVllm],
) -> None:
    """Attacker's test: the gateway never set vLLM's cache_salt, so tenant A, sending
    another tenant's likely prefix, could tell from its own time to first token whether B
    had sent it (a prefix-cache hit). A may also try to name a salt of its own."""
    keys = {name: new_key() for name in ("a", "b", "b2")}
    auth: dict[str, Any] = {
        "enabled": True,
        "keys": [
            {"name": "a", "hash": keys["a"][1]},
            {"name": "b", "hash": keys["b"][1], "owner": "team-b"},
            {"name": "b2", "hash": keys["b2"][1], "owner": "team-b"},
        ],
    }
    settings = gateway_settings([fakes[0].url], [fakes[2].url], auth=auth)
    with running_gateway(settings) as base:
        for path, body in BODIES.items():
            for name in ("a", "b", "b2", "a"):
                sent = {"model": MODEL, "cache_salt": "guessed-salt-of-b", **body}
                answer = httpx.post(
                    f"{base}{path}",
                    json=sent,
                    headers={"authorization": f"Bearer {keys[name][0]}"},
                    timeout=10,
                )
                assert answer.status_code == 200, answer.text
    salts = [b.get("cache_salt") for b in fakes[0].record.bodies]
    assert len(salts) == 12
    for i in range(0, 12, 4):  # per route: a, b, b2 (b's owner), a again
        a, b, b2, a_again = salts[i : i + 4]
        assert isinstance(a, str) and isinstance(b, str) and len(a) >= 16
        assert a != b, "two tenants share a salt: one can time the other's prefixes"
        assert b == b2, "one owner's keys share its cache"
        assert a == a_again, "a tenant keeps its own cache hits"
        assert "guessed-salt-of-b" not in (a, b), "the caller's salt is overridden"
    assert len({s for s in salts}) == 2  # one salt per tenant, on every route


def test_replicas_sharing_the_secret_give_a_tenant_one_salt(fakes: list[FakeVllm]) -> None:
    """routing.cache_salt_secret, the same on every replica: a tenant keeps its cache hits
    whichever replica served it; without it each process draws its own key."""
    body = {"model": MODEL, **BODIES["/v1/chat/completions"]}
    for secret in ("s" * 32, "s" * 32, None):
        routing = {"cache_salt_secret": secret}
        settings = gateway_settings([fakes[0].url], [fakes[2].url], routing=routing)
        with running_gateway(settings) as base:
            assert httpx.post(f"{base}/v1/chat/completions", json=body, timeout=10).is_success
    first, second, unkeyed = (b["cache_salt"] for b in fakes[0].record.bodies)
    assert first == second != unkeyed
