"""The tier policy: one decision, with its reason, from what was asked, the key, what each
tier serves and the fast tier's headroom."""

from __future__ import annotations

import pytest

from tiergate.accesssettings import ApiKey
from tiergate.gateway.access.auth import ANONYMOUS, Caller
from tiergate.gateway.access.policy import AskedTier, Needs, Reason, TierChoice, TierPolicy
from tiergate.gateway.errors import OpenAIError
from tiergate.settings import PolicySettings
from tiergate.tiers import Tier

CHAT = Needs("/v1/chat/completions")


def _key(*tiers: str) -> Caller:
    key = ApiKey.model_validate({"name": "k", "hash": "sha256:" + "0" * 64, "tiers": list(tiers)})
    return Caller("k", key)


def _policy(
    auto: str = "standard",
    headroom: bool = True,
    fallback: bool = True,
    routes: dict[Tier, set[str]] | None = None,
) -> TierPolicy:
    def serves(tier: Tier, path: str) -> bool | None:
        return None if routes is None else path in routes[tier]

    settings = PolicySettings.model_validate({"auto_tier": auto, "fallback": fallback})
    return TierPolicy(settings, lambda: headroom, serves)


def test_asked_tier_is_served_with_the_other_as_fallback() -> None:
    decision = _policy().decide(ANONYMOUS, AskedTier(Tier.FAST, Reason.REQUESTED), CHAT)
    assert decision == TierChoice(Tier.FAST, Reason.REQUESTED, Tier.STANDARD)
    assert decision.tiers == (Tier.FAST, Tier.STANDARD)
    no_fallback = _policy(fallback=False).decide(ANONYMOUS, AskedTier(Tier.FAST), CHAT)
    assert no_fallback.tiers == (Tier.FAST,)


def test_decision_is_immutable() -> None:
    decision = _policy().decide(ANONYMOUS, AskedTier(None), CHAT)
    with pytest.raises(AttributeError):
        decision.tier = Tier.FAST  # type: ignore[misc]


@pytest.mark.parametrize(
    ("auto", "headroom", "expected"),
    [
        ("standard", True, (Tier.STANDARD, Reason.AUTO)),
        ("fast", False, (Tier.FAST, Reason.AUTO)),
        ("headroom", True, (Tier.FAST, Reason.HEADROOM)),
        ("headroom", False, (Tier.STANDARD, Reason.HEADROOM)),
    ],
)
def test_auto_follows_the_configured_policy(
    auto: str, headroom: bool, expected: tuple[Tier, Reason]
) -> None:
    decision = _policy(auto, headroom).decide(ANONYMOUS, AskedTier(None), CHAT)
    assert (decision.tier, decision.reason) == expected


def test_key_tiers_refuse_an_asked_tier_and_move_an_implicit_one() -> None:
    standard_only = _key("standard")
    with pytest.raises(OpenAIError) as err:
        _policy().decide(standard_only, AskedTier(Tier.FAST, Reason.REQUESTED), CHAT)
    assert err.value.status == 403 and err.value.code == "tier_not_allowed"
    moved = _policy("fast").decide(standard_only, AskedTier(None), CHAT)
    # Moved to the tier the key may use, and no fallback to one it may not.
    assert moved == TierChoice(Tier.STANDARD, Reason.KEY, None)


def test_sampling_the_fast_engine_refuses_goes_to_standard_even_when_asked() -> None:
    needs = Needs("/v1/chat/completions", fast_compatible=False)
    decision = _policy().decide(ANONYMOUS, AskedTier(Tier.FAST, Reason.REQUESTED), needs)
    # And never falls back onto the tier that would refuse it.
    assert decision == TierChoice(Tier.STANDARD, Reason.CAPABILITY, None)


def test_routes_follow_what_each_tier_serves() -> None:
    routes = {Tier.STANDARD: {"/v1/embeddings", "/v1/chat/completions"}, Tier.FAST: set()}
    policy = _policy("fast", routes=routes)
    embed = Needs("/v1/embeddings")
    assert policy.decide(ANONYMOUS, AskedTier(None), embed) == TierChoice(
        Tier.STANDARD, Reason.CAPABILITY
    )
    with pytest.raises(OpenAIError) as not_on_tier:
        policy.decide(_key("fast"), AskedTier(None), embed)
    assert not_on_tier.value.status == 400 and not_on_tier.value.code == "route_not_on_tier"
    with pytest.raises(OpenAIError) as nowhere:
        policy.decide(ANONYMOUS, AskedTier(None), Needs("/v1/rerank"))
    assert nowhere.value.status == 404 and nowhere.value.code == "route_not_served"
    assert "/v1/rerank" in nowhere.value.message


def test_unknown_routes_are_assumed_served() -> None:
    # Before any engine has listed its routes, the engine's own answer decides.
    decision = _policy().decide(ANONYMOUS, AskedTier(None), Needs("/v1/embeddings"))
    assert decision.tier is Tier.STANDARD
