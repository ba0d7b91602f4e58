"""Keys, limits, admission and request guards through a real gateway over FakeVllm."""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any

import httpx
import pytest

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.fault.helpers import metric_value
from tests.servers import gateway_settings, running_gateway
from tests.waiting import eventually
from tiergate.gateway.access.auth import new_key

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


def _keys(**per_key: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    secrets, entries = {}, []
    for name, extra in per_key.items():
        key, digest = new_key()
        secrets[name] = key
        entries.append({"name": name, "hash": digest, **extra})
    return secrets, {"enabled": True, "keys": entries}


def test_cli_creates_a_key_that_works(fakes: list[FakeVllm], tmp_path: Any) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tiergate", "keys", "create", "--name", "cli", "--rpm", "5"],
        capture_output=True,
        text=True,
        check=True,
    )
    key = proc.stdout.strip()
    assert key.startswith("tg-") and key not in proc.stderr
    import json

    entry = json.loads(proc.stderr.strip().splitlines()[-1][2:])
    settings = gateway_settings(
        [fakes[0].url], [fakes[2].url], auth={"enabled": True, "keys": [entry]}
    )
    with running_gateway(settings) as base:
        ok = httpx.post(
            f"{base}/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {key}"}
        )
        assert ok.status_code == 200
        assert ok.headers["x-ratelimit-limit-requests"] == "5"


def test_missing_wrong_and_forbidden_keys(fakes: list[FakeVllm]) -> None:
    keys, auth = _keys(std={"tiers": ["standard"]}, other={"models": ["another-model"]})
    settings = gateway_settings([fakes[0].url], [fakes[2].url], auth=auth)
    with running_gateway(settings) as base:
        url = f"{base}/v1/chat/completions"
        missing = httpx.post(url, json=CHAT)
        assert missing.status_code == 401
        assert missing.json()["error"]["code"] == "missing_api_key"
        wrong = httpx.post(url, json=CHAT, headers={"authorization": "Bearer tg-wrong"})
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
        std = {"authorization": f"Bearer {keys['std']}"}
        denied = httpx.post(url, json={**CHAT, "service_tier": "priority"}, headers=std)
        assert denied.status_code == 403
        assert denied.json()["error"]["code"] == "tier_not_allowed"
        allowed = httpx.post(url, json=CHAT, headers=std)
        assert allowed.status_code == 200 and allowed.json()["service_tier"] == "default"
        assert "server" not in allowed.headers  # callers are not told what serves them
        other = {"authorization": f"Bearer {keys['other']}"}
        model = httpx.post(url, json=CHAT, headers=other)
        assert model.status_code == 403 and model.json()["error"]["code"] == "model_not_allowed"
        assert httpx.get(f"{base}/v1/models", headers=other).json()["data"] == []
        assert httpx.get(f"{base}/v1/models").status_code == 401
        assert httpx.get(f"{base}/healthz").status_code == 200
        assert fakes[0].record.requests == 1 and fakes[2].record.requests == 0


def test_requests_per_minute_gives_429_with_headers(fakes: list[FakeVllm]) -> None:
    keys, auth = _keys(app={"limits": {"requests_per_minute": 3, "tokens_per_minute": 10_000}})
    settings = gateway_settings([fakes[0].url], [fakes[2].url], auth=auth)
    with running_gateway(settings) as base:
        headers = {"authorization": f"Bearer {keys['app']}"}
        answers = [
            httpx.post(f"{base}/v1/chat/completions", json=CHAT, headers=headers) for _ in range(4)
        ]
        assert [a.status_code for a in answers] == [200, 200, 200, 429]
        assert [a.headers["x-ratelimit-remaining-requests"] for a in answers] == [
            "2",
            "1",
            "0",
            "0",
        ]
        assert answers[0].headers["x-ratelimit-limit-tokens"] == "10000"
        assert answers[0].headers["x-ratelimit-reset-requests"].endswith(("ms", "s"))
        refused = answers[-1]
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert refused.json()["error"]["type"] == "rate_limit_error"
        assert int(refused.headers["retry-after"]) >= 1
        assert fakes[0].record.requests == 3
        assert metric_value(base, "tiergate_rate_limited_total", key="app") == 1


def test_tokens_per_minute_counts_the_prompt(fakes: list[FakeVllm]) -> None:
    keys, auth = _keys(app={"limits": {"tokens_per_minute": 100}})
    settings = gateway_settings([fakes[0].url], [fakes[2].url], auth=auth)
    with running_gateway(settings) as base:
        headers = {"authorization": f"Bearer {keys['app']}"}
        big = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 800}]}
        refused = httpx.post(f"{base}/v1/chat/completions", json=big, headers=headers)
        assert refused.status_code == 429  # ~200 tokens estimated > 100 per minute
        assert fakes[0].record.requests == 0
        assert (
            httpx.post(f"{base}/v1/chat/completions", json=CHAT, headers=headers).status_code == 200
        )


def test_concurrent_requests_limit(fakes: list[FakeVllm]) -> None:
    fakes[0].behaviour.chunk_delay = 0.5
    keys, auth = _keys(app={"limits": {"max_concurrent": 1}})
    settings = gateway_settings([fakes[0].url], [fakes[2].url], auth=auth)
    with running_gateway(settings) as base:
        headers = {"authorization": f"Bearer {keys['app']}"}
        slow = threading.Thread(
            target=httpx.post,
            args=(f"{base}/v1/chat/completions",),
            kwargs={"json": CHAT, "headers": headers},
        )
        slow.start()
        eventually(lambda: fakes[0].record.requests == 1, what="the first request at the engine")
        second = httpx.post(f"{base}/v1/chat/completions", json=CHAT, headers=headers)
        slow.join()
        assert second.status_code == 429
        assert (
            httpx.post(f"{base}/v1/chat/completions", json=CHAT, headers=headers).status_code == 200
        )


def test_full_admission_queue_is_503_not_429(fakes: list[FakeVllm]) -> None:
    fakes[0].behaviour.chunk_delay = 1.0
    settings = gateway_settings(
        [fakes[0].url],
        [fakes[2].url],
        policy={"fallback": False},
        admission={
            "tiers": {
                "standard": {"max_concurrent": 1, "max_queue": 1},
                "fast": {"max_concurrent": 8, "max_queue": 8},
            }
        },
    )
    with running_gateway(settings) as base:
        results: list[int] = []

        def call() -> None:
            results.append(
                httpx.post(f"{base}/v1/chat/completions", json=CHAT, timeout=10).status_code
            )

        threads = [threading.Thread(target=call) for _ in range(2)]
        threads[0].start()
        eventually(lambda: fakes[0].record.requests == 1, what="the first request at the engine")
        threads[1].start()
        eventually(
            lambda: (
                metric_value(base, "tiergate_admission_queue_depth", tier="standard", lane="all")
                == 1
            ),
            what="the second request queued",
        )
        third = httpx.post(f"{base}/v1/chat/completions", json=CHAT)
        for thread in threads:
            thread.join()
        assert third.status_code == 503
        assert third.json()["error"]["code"] == "capacity_exceeded"
        assert "retry-after" in third.headers
        assert sorted(results) == [200, 200]  # the queued one was served after the first


def test_auto_takes_fast_while_it_has_headroom(fakes: list[FakeVllm]) -> None:
    fakes[2].behaviour.chunk_delay = 1.0
    settings = gateway_settings(
        [fakes[0].url],
        [fakes[2].url],
        policy={"auto_tier": "headroom"},
        admission={"tiers": {"standard": {"max_concurrent": 8}, "fast": {"max_concurrent": 1}}},
    )
    with running_gateway(settings) as base:
        url = f"{base}/v1/chat/completions"
        busy = threading.Thread(
            target=httpx.post, args=(url,), kwargs={"json": {**CHAT, "service_tier": "auto"}}
        )
        busy.start()
        eventually(lambda: fakes[2].record.requests == 1, what="the busy request at the engine")
        while_busy = httpx.post(url, json={**CHAT, "service_tier": "auto"})
        busy.join()
        idle = httpx.post(url, json=CHAT)
        assert while_busy.json()["service_tier"] == "default"
        assert idle.json()["service_tier"] == "priority"
        assert idle.headers["x-tiergate-tier-reason"] == "headroom"


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_guard(fakes: list[FakeVllm], field: str) -> None:
    settings = gateway_settings([fakes[0].url], [fakes[2].url], gateway={"max_tokens_limit": 1000})
    with running_gateway(settings) as base:
        too_many = httpx.post(f"{base}/v1/chat/completions", json={**CHAT, field: 5000})
        assert too_many.status_code == 400
        assert too_many.json()["error"]["param"] == field
        wrong_type = httpx.post(f"{base}/v1/chat/completions", json={**CHAT, field: "many"})
        assert wrong_type.status_code == 400
        assert (
            httpx.post(f"{base}/v1/chat/completions", json={**CHAT, field: 1000}).status_code == 200
        )
        assert fakes[0].record.requests == 1
