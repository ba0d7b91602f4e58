"""OpenAI's patient and hurried ends of admission: ``flex`` is a capped lane at the lowest
urgency, echoed ``flex`` and refused with 429 ``resource_unavailable`` when full; a
``priority`` request the fast tier cannot take in time is served at ``default``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tiergate.accesssettings import ApiKey
from tiergate.gateway.access.admission import Admission
from tiergate.gateway.access.auth import Caller
from tiergate.gateway.access.gatekeeper import Gatekeeper
from tiergate.gateway.access.limits import Limiter
from tiergate.gateway.access.policy import Reason, TierChoice
from tiergate.gateway.errors import OpenAIError
from tiergate.gateway.metrics import GatewayMetrics
from tiergate.gateway.openai.routes import echo_tier
from tiergate.gateway.openai.selection import inspect, requested_tier
from tiergate.settings import load_settings
from tiergate.tiers import FLEX_URGENCY, Tier


def _gatekeeper(admission: dict[str, Any], policy: dict[str, Any] | None = None) -> Gatekeeper:
    settings = load_settings(admission=admission, policy=policy or {})
    return Gatekeeper(
        settings,
        Limiter(settings.limits),
        Admission(settings.admission, {}),
        GatewayMetrics({}),
    )


def _request(tier: str) -> Any:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "service_tier": tier}
    return inspect(json.dumps(body).encode(), None, 512)


def _choice(gk: Gatekeeper, caller: Caller, req: Any) -> TierChoice:
    """The policy's decision (the model check needs engines, which are not the subject)."""
    return gk.policy.decide(caller, req.asked, req.needs)


def test_flex_is_asked_as_the_standard_engines_patient_lane_and_echoed_flex() -> None:
    asked = requested_tier("Flex")
    assert (asked.tier, asked.flex, asked.urgency) == (Tier.STANDARD, True, FLEX_URGENCY)
    assert requested_tier(None, "flex").flex
    assert not requested_tier("default").flex and not requested_tier("priority").flex
    answer: dict[str, Any] = {}
    echo_tier(answer, Tier.STANDARD, flex=True)
    assert answer["service_tier"] == "flex"
    echo_tier(answer, Tier.STANDARD)
    assert answer["service_tier"] == "default"


async def test_a_full_flex_lane_is_429_resource_unavailable_and_default_still_gets_in() -> None:
    gk = _gatekeeper(
        {
            "tiers": {"standard": {"max_concurrent": 4, "max_queue": 4}},
            "flex": {"max_concurrent": 1, "max_queue": 0, "retry_after_seconds": 7},
        }
    )
    caller = Caller("k", None)
    flex = _request("flex")
    first = await gk.admit(caller, flex, _choice(gk, caller, flex), "r1")
    assert first.choice.flex and first.choice.tier is Tier.STANDARD
    with pytest.raises(OpenAIError) as refused:
        await gk.admit(caller, flex, _choice(gk, caller, flex), "r2")
    err = refused.value
    assert (err.status, err.code) == (429, "resource_unavailable")
    assert err.headers["retry-after"] == "7"
    default = _request("default")
    other = await gk.admit(caller, default, _choice(gk, caller, default), "r3")
    assert other.ticket is not None and other.ticket.waited_seconds == 0.0
    first.end()
    other.end()
    assert gk.admission.flex[Tier.STANDARD].active == 0
    assert gk.admission.tiers[Tier.STANDARD].active == 0


async def test_flex_waits_its_own_timeout_then_429_holding_nothing() -> None:
    gk = _gatekeeper(
        {
            "queue_timeout_seconds": 30,
            "tiers": {"standard": {"max_concurrent": 1, "max_queue": 4}},
            "flex": {"max_concurrent": 4, "max_queue": 4, "queue_timeout_seconds": 0.2},
        }
    )
    caller = Caller("k", None)
    default = _request("default")
    busy = await gk.admit(caller, default, _choice(gk, caller, default), "r1")
    flex = _request("flex")
    with pytest.raises(OpenAIError) as refused:
        await asyncio.wait_for(gk.admit(caller, flex, _choice(gk, caller, flex), "r2"), 5)
    assert (refused.value.status, refused.value.code) == (429, "resource_unavailable")
    assert gk.admission.flex[Tier.STANDARD].active == 0  # its flex slot was given back
    busy.end()


async def test_flex_queues_behind_default_for_a_tier_slot() -> None:
    gk = _gatekeeper({"tiers": {"standard": {"max_concurrent": 1, "max_queue": 4}}})
    caller = Caller("k", None)
    default, flex = _request("default"), _request("flex")
    holder = await gk.admit(caller, default, _choice(gk, caller, default), "r0")
    order: list[str] = []

    async def take(name: str, req: Any) -> None:
        lease = await gk.admit(caller, req, _choice(gk, caller, req), name)
        order.append(name)
        lease.end()

    waiting = [asyncio.create_task(take("flex", flex))]
    await asyncio.sleep(0.05)
    waiting.append(asyncio.create_task(take("default", default)))
    await asyncio.sleep(0.05)
    holder.end()
    await asyncio.wait_for(asyncio.gather(*waiting), 5)
    assert order == ["default", "flex"]


async def test_priority_the_fast_tier_cannot_take_is_served_at_default() -> None:
    gk = _gatekeeper(
        {
            "priority_wait_seconds": 0.1,
            "tiers": {"fast": {"max_concurrent": 1, "max_queue": 4}},
        }
    )
    caller = Caller("k", None)
    priority = _request("priority")
    first = await gk.admit(caller, priority, _choice(gk, caller, priority), "r1")
    assert first.choice.tier is Tier.FAST
    moved = await asyncio.wait_for(
        gk.admit(caller, priority, _choice(gk, caller, priority), "r2"), 5
    )
    assert (moved.choice.tier, moved.choice.reason) == (Tier.STANDARD, Reason.BUSY)
    answer: dict[str, Any] = {}
    echo_tier(answer, moved.choice.tier, moved.choice.flex)
    assert answer["service_tier"] == "default"
    first.end()
    moved.end()
    assert gk.admission.tiers[Tier.FAST].active == gk.admission.tiers[Tier.STANDARD].active == 0


async def test_priority_is_not_moved_where_the_key_may_not_use_standard_or_it_is_off() -> None:
    # No reserve: a tenant with one request in flight would otherwise be let in past the
    # full gate (admission.flow.reserve), and the tier would not be busy for it.
    admission = {
        "priority_wait_seconds": 0.1,
        "tiers": {"fast": {"max_concurrent": 1}},
        "flow": {"reserve": 0},
    }
    key = ApiKey.model_validate({"name": "k", "hash": "sha256:" + "0" * 64, "tiers": ["fast"]})
    for caller, policy in (
        (Caller("k", key), {}),
        (Caller("k", None), {"busy_downgrade": False}),
    ):
        gk = _gatekeeper({**admission, "queue_timeout_seconds": 0.2}, policy)
        priority = _request("priority")
        first = await gk.admit(caller, priority, _choice(gk, caller, priority), "r1")
        with pytest.raises(OpenAIError) as refused:
            await asyncio.wait_for(
                gk.admit(caller, priority, _choice(gk, caller, priority), "r2"), 5
            )
        assert (refused.value.status, refused.value.code) == (503, "capacity_exceeded")
        first.end()
