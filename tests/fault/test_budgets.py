"""Spend budgets (tiergate.gateway.access.budgets, issue 52 item 3): a key past its day's
tokens is refused with OpenAI's 429 ``insufficient_quota`` on every route, before anything
reaches an engine, while other keys are served; a team's keys share the team's budget; two
replicas share one count through a real Redis; the day turns on a fake clock and the key
is served again; ``GET /v1/usage`` shows a key its own budgets and no one else's. Real
gateways over fake vLLM servers (their usage: a few tokens an answer, read from each)."""

from __future__ import annotations

import asyncio
import calendar
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.fault.test_shared_limits_redis import RedisServer, redis_server  # noqa: F401
from tests.servers import gateway_settings, running_gateway
from tests.waiting import eventually
from tiergate.accesssettings import ApiKey, AuthSettings, KeyLimits, LimitSettings, TeamBudget
from tiergate.gateway.access.auth import Caller, new_key
from tiergate.gateway.access.budgets import Budgets
from tiergate.gateway.access.limits import Limiter
from tiergate.gateway.errors import OpenAIError
from tiergate.protocol.openaibatch import LIMIT_HEADER
from tiergate.tiers import Tier

ROUTES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"prompt": "hi"},
    "/v1/responses": {"input": "hi"},
}


def _auth(**budgets: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    keys: dict[str, str] = {}
    entries = []
    for name, spec in budgets.items():
        key, digest = new_key()
        keys[name] = key
        entries.append({"name": name, "hash": digest, **spec})
    return {"enabled": True, "keys": entries, "teams": {"team-t": {"tokens_per_day": 40}}}, keys


def _post(base: str, key: str, path: str = "/v1/chat/completions") -> httpx.Response:
    return httpx.post(
        f"{base}{path}",
        json={"model": MODEL, **ROUTES[path]},
        headers={"authorization": f"Bearer {key}"},
        timeout=10,
    )


def test_a_key_past_its_days_tokens_is_refused_on_every_route_and_others_are_served(
    fakes: list[FakeVllm],
) -> None:
    auth, keys = _auth(a={"limits": {"tokens_per_day": 30}}, b={})
    settings = gateway_settings([fakes[0].url], [fakes[2].url], auth=auth)
    with running_gateway(settings) as base:
        totals: list[int] = []
        while True:
            answer = _post(base, keys["a"])
            if answer.status_code != 200:
                break
            totals.append(answer.json()["usage"]["total_tokens"])
            assert int(answer.headers["x-tiergate-budget-remaining-tokens"]) >= 0
            assert len(totals) < 20, "the budget never ran out"
        # Admitted while the day had room for the prompt's estimate; charged what was used.
        assert totals and sum(totals[:-1]) < 30 <= sum(totals) + 8, totals
        assert answer.status_code == 429, answer.text
        error = answer.json()["error"]
        assert error["code"] == "insufficient_quota" and error["type"] == "insufficient_quota"
        assert "30 tokens per day" in error["message"] and "has 0 left" in error["message"]
        assert answer.headers[LIMIT_HEADER] == "budget"
        assert 0 < int(answer.headers["retry-after"]) <= 86400
        reached = len(fakes[0].record.bodies) + len(fakes[2].record.bodies)
        for path in ROUTES:
            refused = _post(base, keys["a"], path)
            assert refused.status_code == 429, (path, refused.text)
            assert refused.json()["error"]["code"] == "insufficient_quota"
        assert len(fakes[0].record.bodies) + len(fakes[2].record.bodies) == reached
        assert _post(base, keys["b"]).status_code == 200  # another key: its own count

        usage = httpx.get(f"{base}/v1/usage", headers={"authorization": f"Bearer {keys['a']}"})
        (day,) = usage.json()["data"]
        assert (day["scope"], day["period"], day["limit_tokens"]) == ("key", "day", 30)
        assert day["spent_tokens"] == sum(totals) and day["remaining_tokens"] == 0
        other = httpx.get(f"{base}/v1/usage", headers={"authorization": f"Bearer {keys['b']}"})
        assert other.json() == {"object": "list", "key": "b", "data": []}


def test_a_teams_keys_share_its_budget(fakes: list[FakeVllm]) -> None:
    auth, keys = _auth(t1={"owner": "team-t"}, t2={"owner": "team-t"}, solo={})
    settings = gateway_settings([fakes[0].url], [fakes[2].url], auth=auth)
    with running_gateway(settings) as base:
        sent = [_post(base, keys["t1" if i % 2 else "t2"]) for i in range(12)]
        served = [a for a in sent if a.status_code == 200]
        totals = [a.json()["usage"]["total_tokens"] for a in served]
        # 40 a day for both keys together: one count, whichever key spends it.
        assert [a.status_code for a in sent] == [200] * len(served) + [429] * (12 - len(served))
        assert sum(totals[:-1]) < 40 <= sum(totals) + 8, totals
        usage = httpx.get(f"{base}/v1/usage", headers={"authorization": f"Bearer {keys['t1']}"})
        (team,) = usage.json()["data"]
        assert (team["scope"], team["name"], team["spent_tokens"]) == (
            "team",
            "team-t",
            sum(totals),
        )
        assert _post(base, keys["solo"]).status_code == 200


def test_two_replicas_share_one_budget_through_redis(
    fakes: list[FakeVllm],
    redis_server: RedisServer,  # noqa: F811
) -> None:
    auth, keys = _auth(a={"limits": {"tokens_per_day": 30}})
    settings = gateway_settings(
        [fakes[0].url], [fakes[2].url], auth=auth, limits={"redis_url": redis_server.url}
    )
    with ExitStack() as stack:
        one = stack.enter_context(running_gateway(settings))
        two = stack.enter_context(running_gateway(settings))
        sent = [_post(one if i % 2 else two, keys["a"]) for i in range(8)]
        codes = [a.status_code for a in sent]
        totals = [a.json()["usage"]["total_tokens"] for a in sent if a.status_code == 200]
        # One count: each replica alone would have served about twice as many.
        assert codes == [200] * len(totals) + [429] * (8 - len(totals)), codes
        assert sum(totals[:-1]) < 30 <= sum(totals) + 8, totals


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _key(limits: dict[str, float]) -> Caller:
    _, digest = new_key()
    return Caller("k", ApiKey(name="k", hash=digest, limits=KeyLimits(**limits)))


@pytest.mark.parametrize("shared", [False, True])
def test_the_day_turns_on_a_fake_clock_and_the_month_does_not(
    shared: bool,
    redis_server: RedisServer,  # noqa: F811
) -> None:
    async def scenario() -> None:
        limiter = Limiter(LimitSettings(redis_url=redis_server.url if shared else None))
        clock = Clock(calendar.timegm((2026, 12, 31, 23, 59, 0)))
        budgets = Budgets(AuthSettings(), limiter, clock)
        caller = _key({"tokens_per_day": 100, "tokens_per_month": 150})
        first = await budgets.charge(caller, 60, Tier.STANDARD)
        assert first is not None and first.shared is shared
        budgets.settle(first, 90, Tier.STANDARD)  # the answer used more than the prompt's estimate
        await budgets.close()
        with pytest.raises(OpenAIError) as refused:
            await budgets.charge(caller, 20, Tier.STANDARD)
        assert refused.value.code == "insufficient_quota" and "per day" in refused.value.message
        assert int(refused.value.headers["retry-after"]) == 60  # to midnight UTC
        clock.now += 61  # a new day, and a new month too (December ends)
        again = await budgets.charge(caller, 20, Tier.STANDARD)
        assert again is not None
        budgets.settle(again, 20, Tier.STANDARD)
        clock.now += 86400  # the day after: the month's 150 hold
        assert await budgets.charge(caller, 100, Tier.STANDARD) is not None  # the month at 120
        clock.now += 86400
        with pytest.raises(OpenAIError) as month:
            await budgets.charge(caller, 31, Tier.STANDARD)
        assert "per month" in month.value.message
        assert await budgets.charge(caller, 30, Tier.STANDARD) is not None
        await limiter.close()

    asyncio.run(scenario())


def test_a_refused_request_gives_its_charge_back() -> None:
    async def scenario() -> None:
        budgets = Budgets(AuthSettings(), Limiter(LimitSettings()), Clock(1.8e9))
        caller = _key({"tokens_per_day": 10})
        charge = await budgets.charge(caller, 8, Tier.STANDARD)
        assert charge is not None
        budgets.settle(charge, 0, Tier.STANDARD)  # refused before an engine: Lease.refuse
        assert await budgets.charge(caller, 8, Tier.STANDARD) is not None

    asyncio.run(scenario())


def test_requests_that_never_reach_an_answer_give_their_charge_back(
    fakes: list[FakeVllm],
) -> None:
    """Review finding: the budget was charged before admission and kept when the engine
    refused the request, or when the caller left while queued. Neither costs the key."""
    auth, keys = _auth(a={"limits": {"tokens_per_day": 1000}})
    settings = gateway_settings(
        [fakes[0].url],
        [fakes[2].url],
        auth=auth,
        # No reserve: the key's second request must queue behind its first.
        admission={"tiers": {"standard": {"max_concurrent": 1}}, "flow": {"reserve": 0}},
        policy={"fallback": False},
    )

    def spent(base: str) -> int:
        got = httpx.get(f"{base}/v1/usage", headers={"authorization": f"Bearer {keys['a']}"})
        return int(got.json()["data"][0]["spent_tokens"])

    with running_gateway(settings) as base:
        fakes[0].behaviour.mode, fakes[0].behaviour.status = "status", 400
        refused = _post(base, keys["a"])
        assert refused.status_code == 400, refused.text
        assert spent(base) == 0
        fakes[0].behaviour.mode = "ok"
        fakes[0].behaviour.chunk_delay = 0.5  # the one slot held for a few seconds
        with ThreadPoolExecutor(2) as pool:
            holder = pool.submit(
                httpx.post,
                f"{base}/v1/chat/completions",
                json={"model": MODEL, "stream": True, **ROUTES["/v1/chat/completions"]},
                headers={"authorization": f"Bearer {keys['a']}"},
                timeout=30,
            )
            eventually(lambda: fakes[0].record.requests >= 2, 10, 0.05, "the slot held")
            with pytest.raises(httpx.ReadTimeout):  # queued behind it, then gone
                httpx.post(
                    f"{base}/v1/chat/completions",
                    json={"model": MODEL, **ROUTES["/v1/chat/completions"]},
                    headers={"authorization": f"Bearer {keys['a']}"},
                    timeout=0.5,
                )
            answered = holder.result()
        assert answered.status_code == 200
        # Only the answered stream is charged, its usage (3 + 5 tokens from the fake);
        # nothing for the refused request or the one whose caller left while queued.
        seen: list[int] = []
        eventually(lambda: seen.append(spent(base)) or seen[-1] == 8, 10, 0.1, lambda: seen)


def test_a_jobs_calls_count_against_its_team_not_a_teammates_key() -> None:
    """Review finding: a job's model call is made as its owner's first key, so with two
    keys on one team, one key's jobs spent the other key's own budget. They count against
    the team's budgets alone; a key with no team is its own."""
    _, digest = new_key()
    teammate = ApiKey(name="alice", hash=digest, owner="team-t", limits=KeyLimits(tokens_per_day=5))
    auth = AuthSettings(teams={"team-t": TeamBudget(tokens_per_day=100)})
    budgets = Budgets(auth, Limiter(LimitSettings()), Clock(1.8e9))
    as_job = Caller("alice", teammate, for_job=True)
    assert [(a.scope, a.limit) for a in budgets.accounts(as_job)] == [("team", 100)]
    direct = Caller("alice", teammate)
    assert [(a.scope, a.limit) for a in budgets.accounts(direct)] == [("key", 5), ("team", 100)]
    _, solo_digest = new_key()
    solo = ApiKey(name="solo", hash=solo_digest, limits=KeyLimits(tokens_per_day=7))
    assert [a.scope for a in budgets.accounts(Caller("solo", solo, for_job=True))] == ["key"]
