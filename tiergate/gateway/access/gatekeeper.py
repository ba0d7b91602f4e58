"""Who gets in and when: authentication, key permissions, per-key limits, tier admission."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from tiergate.accesssettings import KeyLimits
from tiergate.gateway.access.admission import Admission
from tiergate.gateway.access.auth import Authenticator, Caller
from tiergate.gateway.access.budgets import Budgets, Charge
from tiergate.gateway.access.fairshare import ServedTokens
from tiergate.gateway.access.gate import Ticket
from tiergate.gateway.access.limits import Decision, Limiter
from tiergate.gateway.access.models import ServedModels
from tiergate.gateway.access.patience import PatientLane
from tiergate.gateway.access.policy import (
    AskedTier,
    FastUnready,
    Needs,
    RouteSupport,
    TierChoice,
    TierPolicy,
)
from tiergate.gateway.errors import OpenAIError
from tiergate.gateway.metrics import GatewayMetrics
from tiergate.protocol.openaibatch import LIMIT_HEADER
from tiergate.settings import Settings
from tiergate.tiers import FLEX_URGENCY, Tier


class Asking(Protocol):
    """What access control reads of a request (the proxy's inspected request is one)."""

    @property
    def model(self) -> str: ...
    @property
    def asked(self) -> AskedTier: ...
    @property
    def needs(self) -> Needs: ...
    @property
    def prompt_chars(self) -> int: ...


@dataclass(slots=True)
class Lease:
    """What one admitted request holds: a limits decision and admission slots. Ended exactly
    once, with the usage the backend reported, when the response (or stream) ends."""

    caller: Caller
    limiter: Limiter
    request_id: str
    estimate: int
    # The tier the request was admitted on: the policy's decision, or the one it gave
    # instead when that tier's admission was busy (TierPolicy.when_busy).
    choice: TierChoice
    decision: Decision | None = None
    ticket: Ticket | None = None
    headers: dict[str, str] = field(default_factory=dict)
    # The tier whose engine answered, once one did: the admitted tier's, or its fallback's
    # (tiergate.gateway.openai.upstream). Its price is the one a budget in dollars pays.
    answered_on: Tier | None = None
    # An interactive request's patient lane, and the patient requests in flight when it
    # was admitted: its answer's TPOT and TTFT are that lane's signal (PatientLane.observe).
    lane: PatientLane | None = None
    # What the request charged to its key's and team's spend budgets, and their book.
    charge: Charge | None = None
    budgets: Budgets | None = None
    usage_counter: Any = None
    lane_at_start: int = 0
    # The tier's flow control (an interactive request's answer times are its signal too),
    # with the requests in flight on the tier when it was admitted.
    flow: PatientLane | None = None
    flow_at_start: int = 0
    # The served-token count of the engines it was admitted to: charged the prompt's
    # estimate at admission, corrected with the engine's usage at the end.
    served: ServedTokens | None = None
    _ended: bool = False

    def observe_answer(self, tier: Tier, tpot: float, ttft: float) -> None:
        """An interactive answer served on ``tier`` (a stream, or a non-streamed answer read
        from the engine's stream) ended with these times per output token and to its first
        token."""
        if tier is not self.choice.tier:
            return
        # The time to first token the engines gave: not the wait for this gateway's own
        # slot, which flow control makes (counted, a queue it held would read as a slower
        # engine and cut the limit again: with TTFT judged the tier sat at its floor).
        waited = self.ticket.waited_seconds if self.ticket is not None else 0.0
        ttft = max(0.0, ttft - waited)
        owner = self.caller.owner
        if self.lane is not None:
            self.lane.observe(tpot, ttft, self.estimate, self.lane_at_start, owner)
        if self.flow is not None:
            self.flow.observe(tpot, ttft, self.estimate, self.flow_at_start, owner)

    def refuse(self) -> None:
        """End a request refused before it reached an engine: its budget charge is given
        back whole (its rate-limit charges stand, as before)."""
        if self.charge is not None and self.budgets is not None:
            self.budgets.settle(self.charge, 0, self.choice.tier)  # 0 costs 0 on any tier
        self.end()

    def end(self, usage: dict[str, Any] | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        # Counted before the slot is handed on: the next holder is chosen by these counts.
        if self.served is not None and self.ticket is not None and usage:
            prompt, output = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if isinstance(prompt, int) and isinstance(output, int):
                tokens = self.served.tokens(prompt - self.estimate, output)
                self.served.charge(self.ticket.owner, tokens, self.caller.weight)
        if self.ticket is not None:
            self.ticket.release()
        total = usage.get("total_tokens") if usage else None
        tier = self.answered_on or self.choice.tier
        if self.charge is not None and self.budgets is not None:
            used = total if isinstance(total, int) else None
            self.budgets.settle(self.charge, used, tier)
        if self.usage_counter is not None and isinstance(total, int) and self.caller.key:
            self.usage_counter.labels(self.caller.owner, tier.value).inc(total)
        if self.decision is not None and self.decision.allowed:
            correction = int(total) - self.estimate if isinstance(total, int) else 0
            self.limiter.settle(self.caller.name, correction, self.request_id, self.decision.shared)


class Gatekeeper:
    """Applies, in order: the key (401), its models (403), the tier policy (403 for a tier
    the key may not use), its limits (429), and the chosen tier's admission queue (503)."""

    def __init__(
        self,
        settings: Settings,
        limiter: Limiter,
        admission: Admission,
        metrics: GatewayMetrics,
        serves_route: RouteSupport = lambda tier, path: None,
        models: ServedModels | None = None,
        fast_unready: FastUnready | None = None,
    ) -> None:
        self._settings = settings
        self.models = models or ServedModels({})
        self.authenticator = Authenticator(settings.auth)
        self.limiter = limiter
        self.admission = admission
        self._metrics = metrics
        self.policy = TierPolicy(
            settings.policy, admission.fast_has_headroom, serves_route, fast_unready
        )
        self.budgets = Budgets(settings.auth, limiter)

    def authenticate(self, authorization: str | None, on_behalf_of: str | None = None) -> Caller:
        return self.authenticator.authenticate(authorization, on_behalf_of)

    async def count_request(self, caller: Caller, request_id: str) -> dict[str, str]:
        """Count one request (a job submission) against the key's requests per minute;
        429 when over. Returns the rate-limit headers."""
        key = caller.key
        if key is None or not key.limits.requests_per_minute:
            return {}
        limits = KeyLimits(requests_per_minute=key.limits.requests_per_minute)
        decision = await self.limiter.admit(caller.name, limits, 1, request_id)
        if not decision.allowed:
            raise self._refused(caller, decision, decision.headers())
        self.limiter.settle(caller.name, 0, request_id, decision.shared)
        return decision.headers()

    def _refused(self, caller: Caller, decision: Decision, headers: dict[str, str]) -> OpenAIError:
        """The 429 for a request over the key's limits (counted in the metrics), naming the
        limit in ``x-tiergate-limit`` (``requests``, ``tokens`` or ``concurrency``): a
        batch line waits out the key's own concurrency, never its rates
        (tiergate.jobs.lines.runner)."""
        self._metrics.rate_limited.labels(caller.name, decision.reason).inc()
        return OpenAIError(
            429,
            _limit_message(decision),
            code="rate_limit_exceeded",
            type_="rate_limit_error",
            headers={**headers, LIMIT_HEADER: decision.reason},
        )

    def check_model(self, caller: Caller, model: str) -> None:
        """The one model check, for requests and jobs alike (:class:`ServedModels`)."""
        self.models.check(caller, model)

    def decide(self, caller: Caller, req: Asking) -> TierChoice:
        """The model check, then the tier policy's decision."""
        self.models.check(caller, req.model)
        return self.policy.decide(caller, req.asked, req.needs)

    def estimate_tokens(self, req: Asking) -> int:
        return max(1, math.ceil(req.prompt_chars / self._settings.limits.chars_per_token))

    async def admit(
        self, caller: Caller, req: Asking, choice: TierChoice, request_id: str
    ) -> Lease:
        """The key's limits (429), then admission on ``choice.tier`` (503; 429 for flex).
        A request the policy would move when its tier is busy waits there only
        ``admission.priority_wait_seconds`` before it is admitted on the policy's other
        choice; the lease says which (``lease.choice``)."""
        estimate = self.estimate_tokens(req)
        lease = Lease(caller, self.limiter, request_id, estimate, choice)
        lease.usage_counter = self._metrics.usage_tokens
        key = caller.key
        # The spend budgets first: a key whose day is spent is told so, not rate limited.
        charge = await self.budgets.charge(caller, estimate, choice.tier)
        if charge is not None:
            lease.charge, lease.budgets = charge, self.budgets
            lease.headers = charge.headers()
        try:
            if key is not None and (
                key.limits.requests_per_minute
                or key.limits.tokens_per_minute
                or key.limits.max_concurrent
            ):
                decision = await self.limiter.admit(caller.name, key.limits, estimate, request_id)
                lease.decision = decision
                lease.headers = {**lease.headers, **decision.headers()}
                if not decision.allowed:
                    lease.refuse()
                    raise self._refused(caller, decision, lease.headers)
            rank = admission_rank(caller.priority, choice.urgency)
            # The tenant its gates share fairly; without keys, one tenant (no reserve).
            owner = caller.owner if caller.key is not None else ""
            # Patient: flex, and every call of an agent job (batch lines among them).
            patient = choice.flex or caller.for_job
            long_prompt = self.admission.is_long(estimate)
            instead = self.policy.when_busy(caller, choice, req.needs)
            try:
                try:
                    wait = (
                        None if instead is None else self._settings.admission.priority_wait_seconds
                    )
                    lease.ticket = await self.admission.admit(
                        choice.tier, rank, long_prompt, choice.flex, wait, patient, owner
                    )
                except OpenAIError as err:
                    if instead is None or err.code != "capacity_exceeded":
                        raise
                    self._metrics.admission_rejected.labels(choice.tier.value).inc()
                    lease.choice = instead
                    lease.ticket = await self.admission.admit(
                        instead.tier, rank, long_prompt, patient=patient, owner=owner
                    )
            except OpenAIError as err:
                lease.refuse()
                self._metrics.admission_rejected.labels(lease.choice.tier.value).inc()
                err.headers = {**lease.headers, **err.headers}
                raise
        except BaseException:
            # Refused, or the caller gone while it queued (a cancellation): the budget's
            # charge and the limits' holds are given back (refuse() is idempotent).
            lease.refuse()
            raise
        m = self._metrics
        m.observe(m.queue_wait, lease.ticket.waited_seconds, lease.choice.tier)
        tier = lease.choice.tier
        lease.served = self.admission.served[tier]
        lease.served.charge(lease.ticket.owner, lease.served.tokens(estimate, 0), caller.weight)
        if not patient:
            lease.lane = self.admission.patient[tier]
            lease.lane_at_start = lease.lane.started()
            lease.flow = self.admission.flow.get(tier)
            if lease.flow is not None:
                lease.flow_at_start = lease.flow.started()
        return lease


def admission_rank(key_priority: int, urgency: int) -> int:
    """A request's place in a tier's admission queue (higher first): its urgency first
    (priority, then default, then flex and agent jobs), then its key's priority (0-9)."""
    return (FLEX_URGENCY - urgency) * 10 + key_priority


def _limit_message(decision: Decision) -> str:
    what = {
        "requests": f"requests per minute ({decision.limits.requests_per_minute})",
        "tokens": f"tokens per minute ({decision.limits.tokens_per_minute})",
        "concurrency": f"concurrent requests ({decision.limits.max_concurrent})",
    }.get(decision.reason, decision.reason)
    return f"Rate limit reached for {what}. Retry after the time in the retry-after header."
