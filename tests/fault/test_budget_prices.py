"""Spend budgets in dollars: each tier's tokens at its price (issue 52 item 3).

The attacker's view: a key whose budget is in dollars must not stretch it by asking for
the cheaper-priced engine's estimate and being served on the dearer one, nor by a tier
that has no price (settings refuse it), and a team's keys share one purse across replicas."""

from __future__ import annotations

import asyncio
import calendar
import json
import re
from pathlib import Path

import httpx
import pytest
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.fault.test_budgets import Clock, _key
from tests.fault.test_shared_limits_redis import RedisServer, redis_server  # noqa: F401
from tests.servers import gateway_settings, running_gateway
from tiergate.accesssettings import ApiKey, AuthSettings, LimitSettings, TeamBudget
from tiergate.cli import app as cli_app
from tiergate.gateway.access.auth import Authenticator, Caller, KeysFileError, new_key
from tiergate.gateway.access.budgets import BUDGET_REMAINING_USD, Budgets
from tiergate.gateway.access.limits import Limiter
from tiergate.gateway.errors import OpenAIError
from tiergate.tiers import Tier

PRICES = {Tier.STANDARD: 1.0, Tier.FAST: 4.0}  # dollars per million tokens


@pytest.mark.parametrize("shared", [False, True])
def test_a_dollar_budget_counts_each_tiers_tokens_at_its_price(
    shared: bool,
    redis_server: RedisServer,  # noqa: F811
) -> None:
    async def scenario() -> None:
        limiter = Limiter(LimitSettings(redis_url=redis_server.url if shared else None))
        clock = Clock(calendar.timegm((2026, 12, 7, 12, 0, 0)))
        budgets = Budgets(AuthSettings(prices=PRICES), limiter, clock)
        # $0.0001 a day: 100 micro-dollars, 100 standard tokens or 25 fast ones.
        caller = _key({"spend_per_day": 0.0001, "tokens_per_day": 1000})
        fast = await budgets.charge(caller, 10, Tier.FAST)
        assert fast is not None and fast.shared is shared
        assert fast.costs == [10, 40]  # the token budget, the dollar budget
        assert fast.headers()[BUDGET_REMAINING_USD] == "0.000060"
        budgets.settle(fast, 20, Tier.FAST)  # 20 tokens used on fast: 80 micro-dollars
        await budgets.close()
        assert await _spent(budgets, caller) == {"tokens": 20, "usd": 0.00008}
        # Asked on fast, answered on standard (the policy moved it): the standard price.
        moved = await budgets.charge(caller, 5, Tier.FAST)
        assert moved is not None
        budgets.settle(moved, 10, Tier.STANDARD)
        await budgets.close()
        assert await _spent(budgets, caller) == {"tokens": 30, "usd": 0.00009}
        # 11 fast tokens' estimate (44 micro-dollars) does not fit the 10 left; 10
        # standard ones do. The token budget, far from spent, does not decide.
        with pytest.raises(OpenAIError) as refused:
            await budgets.charge(caller, 11, Tier.FAST)
        error = refused.value
        assert error.status == 429 and error.code == "insufficient_quota"
        assert "$0.0001 per day" in error.message and "$0.00001 left" in error.message
        assert error.headers[BUDGET_REMAINING_USD] == "0.000010"
        assert await _spent(budgets, caller) == {"tokens": 30, "usd": 0.00009}  # unchanged
        last = await budgets.charge(caller, 10, Tier.STANDARD)
        assert last is not None
        budgets.settle(last, 0, Tier.STANDARD)  # refused before an engine: given back
        await budgets.close()
        assert await _spent(budgets, caller) == {"tokens": 30, "usd": 0.00009}
        clock.now += 12 * 3600  # the day turns
        assert await budgets.charge(caller, 25, Tier.FAST) is not None
        await limiter.close()

    asyncio.run(scenario())


async def _spent(budgets: Budgets, caller: Caller) -> dict[str, float]:
    return {
        b["unit"]: b["spent_usd"] if b["unit"] == "usd" else b["spent_tokens"]
        for b in await budgets.usage(caller)
    }


def test_a_spend_budget_needs_a_price_for_every_tier(tmp_path: Path) -> None:
    spender_key, digest = new_key()
    spender = {"name": "a", "hash": digest, "limits": {"spend_per_day": 5.0}}
    with pytest.raises(ValidationError, match="no price for fast"):
        AuthSettings(enabled=True, keys=[spender], prices={Tier.STANDARD: 1.0})
    with pytest.raises(ValidationError, match="no price for standard, fast"):
        AuthSettings(teams={"t": TeamBudget(spend_per_month=100.0)})
    with pytest.raises(ValidationError, match="dollars per million tokens"):
        AuthSettings(prices={Tier.STANDARD: -1.0, Tier.FAST: 1.0})
    # Rounded up to the micro-dollar, but not by binary noise (100 x 0.07 is 7, not 8).
    book = Budgets(
        AuthSettings(prices={Tier.STANDARD: 0.07, Tier.FAST: 0.5}), Limiter(LimitSettings())
    )
    [account] = book.accounts(_key({"spend_per_day": 1.0}))
    assert book.cost(account, 100, Tier.STANDARD) == 7
    assert book.cost(account, 3, Tier.FAST) == 2  # 1.5 micro-dollars: rounded up
    assert AuthSettings(enabled=True, keys=[spender], prices=PRICES).keys[0].limits.spend_per_day
    # A key file cannot bring a spend budget the settings cannot price.
    _, other = new_key()
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(json.dumps([spender]))
    settings = AuthSettings(
        enabled=True, keys=[ApiKey(name="b", hash=other)], keys_file=str(keys_file)
    )
    with pytest.raises(KeysFileError, match="no price for standard, fast"):
        Authenticator(settings)
    priced = Authenticator(settings.model_copy(update={"prices": PRICES}))
    assert priced.authenticate(f"Bearer {spender_key}").name == "a"


def test_a_budget_redis_cannot_count_is_refused_at_start() -> None:
    # Redis counts a budget as a signed 64-bit integer of tokens or micro-dollars: 1e13
    # dollars is 1e19 micro-dollars, past 2**63, and would fail every request of the key
    # at its first charge. Refused at start, like any other bad setting.
    for limits in ({"spend_per_day": 1e13}, {"tokens_per_month": 10**19}):
        with pytest.raises(ValidationError, match="less than or equal"):
            _key(limits)
        with pytest.raises(ValidationError, match="less than or equal"):
            TeamBudget(**limits)
    assert _key({"spend_per_month": 1e9, "tokens_per_day": 10**15}) is not None


def test_the_manuals_prices_example_is_valid_settings() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "access.md").read_text()
    blocks = re.findall(r"^```yaml\n(.*?)^```$", text, re.S | re.M)
    [example] = [b for b in blocks if "prices:" in b]
    auth = AuthSettings(**yaml.safe_load(example)["auth"])
    assert auth.prices == {Tier.STANDARD: 0.2, Tier.FAST: 0.6}
    assert auth.teams["team-eval"].spend_per_day == 25.0


def _post(base: str, key: str, tier: str) -> httpx.Response:
    return httpx.post(
        f"{base}/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        headers={"authorization": f"Bearer {key}", "x-tiergate-tier": tier},
        timeout=10,
    )


def test_two_replicas_spend_one_teams_dollars_at_each_tiers_price(
    fakes: list[FakeVllm],
    redis_server: RedisServer,  # noqa: F811
) -> None:
    one_key, one_digest = new_key()
    two_key, two_digest = new_key()
    auth = {
        "enabled": True,
        "keys": [
            {"name": "a1", "hash": one_digest, "owner": "team-t"},
            {"name": "a2", "hash": two_digest, "owner": "team-t"},
        ],
        # The fake answers 8 tokens (3 + 5): 8 micro-dollars on standard, 32 on fast.
        "teams": {"team-t": {"spend_per_day": 0.0001}},
        "prices": {"standard": 1.0, "fast": 4.0},
    }
    settings = gateway_settings(
        [fakes[0].url], [fakes[2].url], auth=auth, limits={"redis_url": redis_server.url}
    )
    with running_gateway(settings) as one, running_gateway(settings) as two:
        first = _post(one, one_key, "fast")
        assert first.status_code == 200, first.text
        assert first.json()["usage"]["total_tokens"] == 8
        second = _post(two, two_key, "standard")
        assert second.status_code == 200, second.text
        usage = httpx.get(f"{two}/v1/usage", headers={"authorization": f"Bearer {one_key}"})
        body = usage.json()
        assert body["prices_per_million_tokens"] == {"standard": 1.0, "fast": 4.0}
        (team,) = body["data"]
        assert (team["scope"], team["name"], team["unit"]) == ("team", "team-t", "usd")
        assert team["spent_usd"] == pytest.approx(0.00004)  # 32 + 8 micro-dollars
        assert team["remaining_usd"] == pytest.approx(0.00006)
        # A standard request that the standard engine fails is answered by fast (the
        # policy's fallback): it pays the fast price, 32 micro-dollars, not 8.
        fakes[0].behaviour.mode, fakes[0].behaviour.status = "status", 503
        moved = _post(one, one_key, "standard")
        assert moved.status_code == 200, moved.text
        assert moved.headers["x-tiergate-fallback"] == "true"
        fakes[0].behaviour.mode = "ok"
        usage = httpx.get(f"{one}/v1/usage", headers={"authorization": f"Bearer {one_key}"})
        assert usage.json()["data"][0]["spent_usd"] == pytest.approx(0.00004 + 0.000032)
        # Spend the rest on fast across both replicas: refused once a fast answer no
        # longer fits.
        codes = [_post(one if i % 2 else two, one_key, "fast").status_code for i in range(3)]
        assert 429 in codes, codes
        refused = _post(one, two_key, "fast")
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "insufficient_quota"
        assert float(refused.headers[BUDGET_REMAINING_USD]) < 0.00004

        shown = CliRunner().invoke(cli_app, ["usage", "--base-url", one, "--api-key", two_key])
        assert shown.exit_code == 0, shown.output
        assert "team-t" in shown.output and "usd" in shown.output
        assert "dollars per million tokens: fast 4, standard 1" in shown.output
