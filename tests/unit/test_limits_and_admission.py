from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from pydantic import ValidationError

from tiergate.accesssettings import ApiKey, AuthSettings, KeyLimits
from tiergate.gateway.access.auth import Authenticator, hash_key, new_key
from tiergate.gateway.access.gate import Gate
from tiergate.gateway.access.limits import LocalLimiter, duration
from tiergate.gateway.access.models import ServedModels
from tiergate.gateway.errors import OpenAIError
from tiergate.tiers import Tier


def test_duration_format() -> None:
    assert duration(12) == "12ms"
    assert duration(1500) == "1.5s"
    assert duration(360_000) == "6m0s"


def test_local_requests_per_minute() -> None:
    limiter = LocalLimiter()
    limits = KeyLimits(requests_per_minute=3)
    results = [limiter.admit("k", limits, 1, f"r{i}") for i in range(4)]
    assert [r.allowed for r in results] == [True, True, True, False]
    refused = results[-1]
    assert refused.reason == "requests"
    assert 0 < refused.retry_after_ms <= 20_000  # one request refills in 60 s / 3
    headers = refused.headers()
    assert headers["x-ratelimit-limit-requests"] == "3"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert int(headers["retry-after"]) >= 1


def test_local_tokens_are_corrected_by_usage() -> None:
    limiter = LocalLimiter()
    limits = KeyLimits(tokens_per_minute=1000)
    first = limiter.admit("k", limits, 100, "a")
    assert first.allowed and first.remaining_tokens == 900
    limiter.settle("k", 700, "a")  # the response used 800 tokens, not the 100 estimated
    assert not limiter.admit("k", limits, 300, "b").allowed
    assert limiter.admit("k", limits, 150, "c").allowed


def test_local_concurrency() -> None:
    limiter = LocalLimiter()
    limits = KeyLimits(max_concurrent=1)
    assert limiter.admit("k", limits, 1, "a").allowed
    assert limiter.admit("k", limits, 1, "b").reason == "concurrency"
    limiter.settle("k", 0, "a")
    assert limiter.admit("k", limits, 1, "b").allowed


def test_keys_are_hashes_and_wrong_ones_refused() -> None:
    key, digest = new_key()
    assert key.startswith("tg-") and digest == hash_key(key) and key not in digest
    auth = Authenticator(
        AuthSettings.model_validate(
            {
                "enabled": True,
                "keys": [{"name": "app", "hash": digest, "tiers": ["standard"], "models": ["m"]}],
            }
        )
    )
    caller = auth.authenticate(f"Bearer {key}")
    assert caller.name == "app"
    for header in (None, "Bearer nope", f"Basic {key}", key):
        with pytest.raises(OpenAIError) as err:
            auth.authenticate(header)
        assert err.value.status == 401
    served = ServedModels({Tier.STANDARD: _Reports(frozenset({"m", "other"}))})
    served.check(caller, "m")
    with pytest.raises(OpenAIError) as model:
        served.check(caller, "other")
    assert model.value.status == 403 and model.value.code == "model_not_allowed"
    with pytest.raises(OpenAIError) as unknown:
        served.check(caller, "nope")
    assert unknown.value.status == 404 and unknown.value.code == "model_not_found"
    assert unknown.value.message.endswith("available: m.")  # never the models it may not use
    with pytest.raises(OpenAIError) as starting:
        ServedModels({}).check(caller, "m")
    assert starting.value.status == 503


@dataclass
class _Reports:
    model_names: frozenset[str]


async def test_gate_serves_waiters_by_priority() -> None:
    gate = Gate(capacity=1, max_queue=10)
    await gate.enter(0, 1)
    order: list[str] = []

    async def wait(name: str, priority: int) -> None:
        await gate.enter(priority, 5)
        order.append(name)
        await asyncio.sleep(0.01)
        gate.leave()

    tasks = [asyncio.create_task(wait("low", 0)), asyncio.create_task(wait("high", 9))]
    await asyncio.sleep(0.01)
    assert gate.queued == 2
    gate.leave()
    await asyncio.gather(*tasks)
    assert order == ["high", "low"]
    assert gate.active == 0


async def test_gate_full_queue_and_timeout() -> None:
    gate = Gate(capacity=1, max_queue=1)
    await gate.enter(0, 1)
    waiter = asyncio.create_task(gate.enter(0, 0.5))
    await asyncio.sleep(0.01)
    with pytest.raises(LookupError):
        await gate.enter(0, 1)
    with pytest.raises(TimeoutError):
        await waiter
    gate.leave()
    assert gate.active == 0 and gate.try_enter()  # nothing leaked


def test_a_worker_key_acts_for_a_job_owner_and_no_other_key_may() -> None:
    (owner_key, owner_hash), (worker_key, worker_hash), (other_key, other_hash) = (
        new_key(),
        new_key(),
        new_key(),
    )
    auth = Authenticator(
        AuthSettings(
            enabled=True,
            keys=[
                {
                    "name": "owner",
                    "hash": owner_hash,
                    "tiers": ["standard"],
                    "limits": {"requests_per_minute": 5},
                },
                {"name": "worker", "hash": worker_hash, "acts_for_job_owners": True},
                {"name": "other", "hash": other_hash},
            ],
        )
    )
    owner = auth.authenticate(f"Bearer {owner_key}").owner
    caller = auth.authenticate(f"Bearer {worker_key}", owner)
    # The owner's identity, tiers and limits apply to the agent's model calls.
    assert caller.name == "owner" and caller.owner == owner
    assert not caller.may_use_tier(Tier.FAST)
    assert caller.key is not None and caller.key.limits.requests_per_minute == 5
    assert auth.authenticate(f"Bearer {worker_key}").name == "worker"
    with pytest.raises(OpenAIError) as refused:
        auth.authenticate(f"Bearer {other_key}", owner)
    assert refused.value.status == 403
    # A job is named by its owner's id, never by a key's name (which a new key can take).
    for unknown_owner in ("nobody", "owner"):
        with pytest.raises(OpenAIError) as unknown:
            auth.authenticate(f"Bearer {worker_key}", unknown_owner)
        assert unknown.value.status == 403
    del other_key


def test_an_owner_is_the_keys_stable_id_unless_the_operator_names_one() -> None:
    """Two keys of one name are two owners; an explicit owner is shared on purpose."""
    (_, first), (_, second) = new_key(), new_key()
    a = ApiKey.model_validate({"name": "team", "hash": first})
    b = ApiKey.model_validate({"name": "team", "hash": second})
    assert a.owner_id != b.owner_id
    assert a.owner_id == "key-" + first.removeprefix("sha256:")[:24]
    kept = ApiKey.model_validate({"name": "team-2", "hash": second, "owner": a.owner_id})
    assert kept.owner_id == a.owner_id
    with pytest.raises(ValidationError):
        ApiKey.model_validate({"name": "x", "hash": second, "owner": "../other"})
