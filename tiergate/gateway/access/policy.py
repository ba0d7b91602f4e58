"""The one owner of a request's tier: :class:`TierPolicy` turns what was asked, what the
key may use, what each tier can do and how busy the fast tier is into one immutable
:class:`TierChoice` with its reason. Every route, and job submission, asks it; nothing
else picks or changes a tier (the upstream caller only follows ``decision.tiers``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from tiergate.gateway.access.auth import Caller
from tiergate.gateway.errors import OpenAIError
from tiergate.settings import PolicySettings
from tiergate.tiers import DEFAULT_URGENCY, JOB_URGENCY, Tier


class Reason(StrEnum):
    REQUESTED = "requested"  # the body's service_tier
    HEADER = "header"  # X-Tiergate-Tier
    AUTO = "auto"  # nothing asked: policy.auto_tier
    HEADROOM = "headroom"  # auto, and the fast tier's admission had (or lacked) headroom
    CAPABILITY = "capability"  # the asked tier cannot serve this request; the other can
    KEY = "key"  # the key may not use the implicit tier; it may use the other
    BUSY = "busy"  # priority asked, the fast tier's admission could not take it in time
    # The local stack opened before its fast tier was proven (tiergate.fitting): the fast
    # tier's requests are served by the standard tier while it is fitted, or after that
    # failed.
    FITTING = "fitting"
    UNFITTED = "unfitted"


@dataclass(frozen=True, slots=True)
class AskedTier:
    """What the caller asked for: a tier (or None for auto) and where it was said."""

    tier: Tier | None
    reason: Reason = Reason.AUTO
    urgency: int = DEFAULT_URGENCY  # tiergate.tiers: lower is served first
    flex: bool = False  # OpenAI's `flex`: the patient lane (tiergate.tiers.is_flex)

    @property
    def explicit(self) -> bool:
        return self.tier is not None


@dataclass(frozen=True, slots=True)
class Needs:
    """What serving the request takes of a tier."""

    route: str
    # False when a speculative engine (policy.speculative_tiers: the fast tier's) would
    # refuse the request's sampling options.
    fast_compatible: bool = True


@dataclass(frozen=True, slots=True)
class TierChoice:
    tier: Tier
    reason: Reason
    # The tier to move to before the first byte if ``tier`` has no healthy endpoint.
    fallback: Tier | None = None
    # Where requests share a queue, lower is served first (tiergate.tiers): what was asked,
    # or JOB_URGENCY for an agent job's call.
    urgency: int = DEFAULT_URGENCY
    # The flex lane: admitted through its own capped queue, refused with 429
    # resource_unavailable when full, echoed `flex`.
    flex: bool = False

    @property
    def tiers(self) -> tuple[Tier, ...]:
        return (self.tier,) if self.fallback is None else (self.tier, self.fallback)


# Every tier, in order (iterating the enum itself makes a generator each time).
_TIERS = tuple(Tier)

# Which routes a tier serves: None while its engines have not said (the route is then
# assumed served, and vLLM's own answer stands).
RouteSupport = Callable[[Tier, str], bool | None]
# Why the fast tier cannot serve yet ("fitting", "unfitted": tiergate.fitting), or None.
FastUnready = Callable[[], str | None]


def _fast_ready() -> str | None:
    return None


class TierPolicy:
    """Decides each request's tier; which tier a request moves to and which tiers
    speculate are settings (``policy.fallback_order``, ``policy.speculative_tiers``)."""

    def __init__(
        self,
        settings: PolicySettings,
        fast_has_headroom: Callable[[], bool],
        serves_route: RouteSupport,
        fast_unready: FastUnready | None = None,
    ) -> None:
        self._settings = settings
        self._fast_has_headroom = fast_has_headroom
        self._serves_route = serves_route
        self._fast_unready = fast_unready or _fast_ready
        self._order = {tier: tuple(settings.fallback_order.get(tier, ())) for tier in Tier}
        self._speculative = frozenset(settings.speculative_tiers)

    def _can_serve(self, tier: Tier, needs: Needs) -> bool:
        if not needs.fast_compatible and tier in self._speculative:
            return False
        return self._serves_route(tier, needs.route) is not False

    def _next_serving(self, tier: Tier, usable: list[Tier], needs: Needs) -> Tier | None:
        """The first tier after ``tier`` in its fallback order that the key may use and
        that can serve the request."""
        for other in self._order[tier]:
            if other in usable and self._can_serve(other, needs):
                return other
        return None

    def _default(self) -> tuple[Tier, Reason]:
        auto = self._settings.auto_tier
        if auto == "headroom" and self._fast_unready() is not None:
            return Tier.STANDARD, Reason.HEADROOM  # no fast tier yet: no headroom there
        if auto == "headroom":
            tier = Tier.FAST if self._fast_has_headroom() else Tier.STANDARD
            return tier, Reason.HEADROOM
        return Tier(auto), Reason.AUTO

    def decide(self, caller: Caller, asked: AskedTier, needs: Needs) -> TierChoice:
        """The tier to serve on, or the error that says why none can be: 403 for a tier the
        key may not use, 400 for an asked tier that cannot serve the request, 404 for a
        route neither tier serves."""
        decision = self._decide(caller, asked, needs)
        urgency = max(asked.urgency, JOB_URGENCY) if caller.for_job else asked.urgency
        if urgency == decision.urgency and not asked.flex:  # the usual case: no copy
            return decision  # (dataclasses.replace cost about 1% of a request's CPU)
        return dataclasses.replace(decision, urgency=urgency, flex=asked.flex)

    def when_busy(self, caller: Caller, decision: TierChoice, needs: Needs) -> TierChoice | None:
        """The tier to serve on instead when ``decision.tier``'s admission cannot take the
        request in time, or None (the request is then refused as the queue's answer).

        As OpenAI does with ``priority`` beyond its capacity, a request for the fast tier
        is served at standard speed (echoed ``default``) rather than failed for want of the
        faster lane, where the key may use standard and standard serves the request. The
        flex lane is never moved: its answer when full is 429 ``resource_unavailable``."""
        if decision.tier is not Tier.FAST or decision.flex or not self._settings.busy_downgrade:
            return None
        if not caller.may_use_tier(Tier.STANDARD) or not self._can_serve(Tier.STANDARD, needs):
            return None
        return TierChoice(Tier.STANDARD, Reason.BUSY, None, decision.urgency)

    def _decide(self, caller: Caller, asked: AskedTier, needs: Needs) -> TierChoice:
        usable = [t for t in _TIERS if caller.may_use_tier(t)]
        if asked.tier is not None:
            tier, reason = asked.tier, asked.reason
            if tier not in usable:
                raise _tier_not_allowed(tier)
        else:
            tier, reason = self._default()
            if tier not in usable:
                if not usable:
                    raise _tier_not_allowed(tier)
                tier, reason = self._next_usable(tier, usable), Reason.KEY
        unready = self._fast_unready() if tier is Tier.FAST else None
        if (
            unready is not None
            and Tier.STANDARD in usable
            and self._can_serve(Tier.STANDARD, needs)
        ):
            # Not proven yet: the standard tier serves it, as the same model, and says why.
            # (A key that may use the fast tier alone is sent there, and its pool answers.)
            return TierChoice(Tier.STANDARD, Reason(unready))
        if not self._can_serve(tier, needs):
            # Same capabilities is the promise, so this is a tier whose engine refuses the
            # request's sampling options (speculation) or lacks the route: another serves.
            other = self._next_serving(tier, usable, needs)
            if other is not None:
                return TierChoice(other, Reason.CAPABILITY)
            serving = [t for t in Tier if self._serves_route(t, needs.route) is not False]
            if not serving:
                raise _route_not_served(needs.route)
            if self._serves_route(tier, needs.route) is False:
                raise _route_not_on_tier(tier, needs.route, serving)
            # Sampling options the fast engine refuses, and the key may not use standard:
            # vLLM's own refusal says which option.
        fallback = self._next_serving(tier, usable, needs) if self._settings.fallback else None
        return TierChoice(tier, reason, fallback)

    def _next_usable(self, tier: Tier, usable: list[Tier]) -> Tier:
        """The first tier after ``tier`` in its fallback order that the key may use (any
        it may use, if the order names none)."""
        for other in self._order[tier]:
            if other in usable:
                return other
        return usable[0]


def _tier_not_allowed(tier: Tier) -> OpenAIError:
    return OpenAIError(
        403,
        f"This API key may not use the {tier.value} tier.",
        param="service_tier",
        code="tier_not_allowed",
    )


def _route_not_on_tier(tier: Tier, route: str, serving: list[Tier]) -> OpenAIError:
    others = " or ".join(t.value for t in serving)
    return OpenAIError(
        400,
        f"The {tier.value} tier's engines do not serve {route}, and this API key may not use "
        f"the {others} tier's.",
        param="service_tier",
        code="route_not_on_tier",
    )


def _route_not_served(route: str) -> OpenAIError:
    return OpenAIError(
        404,
        f"No tier's engine serves {route}: vLLM serves it only for a model started for that "
        "task (embeddings, score and rerank need a pooling model; this installation's engines "
        "run a generative one).",
        code="route_not_served",
    )
