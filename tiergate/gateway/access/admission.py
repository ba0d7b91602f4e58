"""Admission in front of each tier's pool: a cap on requests in flight, a bounded priority
queue behind it, and separate caps for the long-context lane and the flex lane.

A full queue is the gateway's capacity, not the caller's limit: it answers 503 with
``retry-after`` (429 is kept for the caller's own limits). The flex lane is the exception,
as at OpenAI: a flex request that finds its lane full, or waits past the lane's (long)
timeout, gets 429 ``resource_unavailable`` with ``retry-after``.

Each tier's cap follows its engines (flow control, ``admission.flow``), and every gate in
front of a group of engines hands a freed slot, within a priority band, to the tenant
served the fewest weighted tokens there recently (``admission.fair_share``;
tiergate.gateway.access.gate, tiergate.gateway.access.fairshare).
"""

from __future__ import annotations

import time
from typing import Any

from tiergate.accesssettings import (
    AdmissionSettings,
    FlowAdmission,
    PatientAdmission,
    TierAdmission,
)
from tiergate.gateway.access.fairshare import ServedTokens
from tiergate.gateway.access.gate import Gate, Ticket
from tiergate.gateway.access.patience import PatientLane
from tiergate.gateway.errors import OpenAIError
from tiergate.tiers import Tier


class Admission:
    """The per-tier gates and the long-context lane's gates."""

    def __init__(
        self,
        settings: AdmissionSettings,
        designated_long: dict[Tier, bool],
        shared_engines: bool = False,
    ) -> None:
        self._settings = settings
        self._flex = settings.flex
        self._patient = settings.patient
        # The weighted tokens each tenant was served on each group of engines (one for
        # both tiers where they share them): the order of every gate in front of them.
        if shared_engines:
            served = ServedTokens(settings.fair_share, "shared")
            self.served = dict.fromkeys(Tier, served)
        else:
            self.served = {tier: ServedTokens(settings.fair_share, tier.value) for tier in Tier}
        self.tiers = {
            tier: Gate(
                cfg.max_concurrent,
                cfg.max_queue,
                served=self.served[tier].served,
                reserve=settings.flow.reserve,
                linger=settings.flow.linger_seconds,
            )
            for tier, cfg in _each(settings)
        }
        # Flow control: each tier's limit follows what its engines take without slowing
        # interactive streams past admission.flow.target_slowdown.
        self.flow = {
            tier: PatientLane(
                _flow_settings(settings.flow, cfg), gate=self.tiers[tier], measure_first=False
            )
            for tier, cfg in _each(settings)
            if settings.flow.adaptive
        }
        # A tier with endpoints designated for long context isolates that lane by endpoint;
        # the others cap how many long prompts may be in flight at once.
        self.long = {
            tier: Gate(settings.long_context_max_concurrent, settings.tiers[tier].max_queue)
            for tier in Tier
            if not designated_long.get(tier, False)
        }
        # Flex requests hold a flex slot as well as a tier slot: at most flex.max_concurrent
        # of a tier's slots go to the patient lane, the rest stay free for interactive calls.
        self.flex = {
            tier: Gate(
                self._flex.max_concurrent, self._flex.max_queue, served=self.served[tier].served
            )
            for tier in Tier
        }
        # Patient requests (flex, agent jobs' calls) hold a patient-lane slot too: one lane
        # per group of engines (both tiers' where they share them), its limit set from what
        # interactive streams see (tiergate.gateway.access.patience).
        if shared_engines:
            lane = self._patient_lane(Tier.STANDARD)
            self.patient = dict.fromkeys(Tier, lane)
        else:
            self.patient = {tier: self._patient_lane(tier) for tier in Tier}

    def _patient_lane(self, tier: Tier) -> PatientLane:
        gate = Gate(
            self._patient.max_concurrent,
            self._patient.max_queue,
            served=self.served[tier].served,
        )
        return PatientLane(self._patient, gate=gate)

    def share_patient_lane(self) -> None:
        """The tiers came to share their engines (the local stack's fast tier joined as
        the standard engines, tiergate.fitting): one patient lane for both from now on."""
        self.patient = dict.fromkeys(Tier, self.patient[Tier.STANDARD])

    def lanes(self) -> list[PatientLane]:
        """Each patient lane once."""
        return list({id(lane): lane for lane in self.patient.values()}.values())

    def tick(self) -> None:
        for lane in [*self.lanes(), *self.flow.values()]:
            lane.tick()

    async def sync_served(self, redis: Any) -> None:
        """Share the served-token counts with the other replicas (ServedTokens.sync): the
        owners each group's gates hold or queue are the ones read back."""
        groups: dict[int, tuple[ServedTokens, set[str]]] = {}
        for tier, served in self.served.items():
            owners = groups.setdefault(id(served), (served, set()))[1]
            for gate in (self.tiers[tier], self.flex[tier], self.patient[tier].gate):
                owners.update(gate.owners())
        for served, owners in groups.values():
            await served.sync(redis, owners)

    def fast_has_headroom(self) -> bool:
        gate = self.tiers[Tier.FAST]
        return gate.queued == 0 and gate.active < gate.capacity * self._settings.auto_fast_headroom

    def is_long(self, prompt_tokens: int) -> bool:
        return prompt_tokens > self._settings.long_context_tokens

    async def admit(
        self,
        tier: Tier,
        priority: int,
        long_prompt: bool,
        flex: bool = False,
        wait_seconds: float | None = None,
        patient: bool = False,
        owner: str = "",
    ) -> Ticket:
        """Slots on ``tier`` (and its lanes), waiting at most ``wait_seconds`` in all (the
        flex lane's timeout for flex, the patient lane's for other patient requests, else
        the queue timeout); refused as the module says. Flex is patient."""
        gate = self.tiers[tier]
        lanes: list[tuple[Gate, str]] = []
        if flex:
            lanes.append((self.flex[tier], "flex lane"))
        if flex or patient:
            lanes.append((self.patient[tier].gate, "patient lane"))
        if long_prompt and tier in self.long:
            lanes.append((self.long[tier], "long-context lane"))
        interactive = not (flex or patient)
        if not lanes and gate.try_enter(owner, may_exceed=interactive, priority=priority):
            return Ticket([gate], 0.0, owner)  # a free slot it may hold: nothing to wait for
        if wait_seconds is None:
            wait_seconds = self._wait_of(flex, patient)
        started = time.perf_counter()
        deadline = started + wait_seconds
        gates: list[Gate] = []
        try:
            for lane, what in [*lanes, (gate, "tier")]:
                may_exceed = interactive and lane is gate  # the tier's reserve
                await self._enter(
                    lane, tier, priority, what, deadline, flex, wait_seconds, owner, may_exceed
                )
                gates.append(lane)
        except BaseException:
            for held in reversed(gates):
                held.leave(owner)
            raise
        return Ticket(gates, time.perf_counter() - started, owner)

    async def _enter(
        self,
        gate: Gate,
        tier: Tier,
        priority: int,
        what: str,
        deadline: float,
        flex: bool,
        waited: float,
        owner: str,
        may_exceed: bool,
    ) -> None:
        wait = max(0.0, deadline - time.perf_counter())
        try:
            await gate.enter(priority, wait, owner, may_exceed)
        except LookupError:
            raise self._refusal(f"The {tier.value} {what} is at capacity", "1", flex) from None
        except TimeoutError:
            raise self._refusal(
                f"Waited {waited:g}s for the {tier.value} {what}", "2", flex
            ) from None

    def _refusal(self, what: str, retry_after: str, flex: bool) -> OpenAIError:
        """A gate full or waited out: OpenAI's flex answer (429, not billed, retry later),
        else a 503 to retry shortly."""
        if flex:
            return OpenAIError(
                429,
                f"{what}: flex capacity is unavailable now; retry later, or use the default tier.",
                code="resource_unavailable",
                type_="rate_limit_error",
                headers={"retry-after": str(self._flex.retry_after_seconds)},
            )
        return OpenAIError(
            503,
            f"{what}; retry shortly.",
            code="capacity_exceeded",
            type_="server_error",
            headers={"retry-after": retry_after},
        )

    def _wait_of(self, flex: bool, patient: bool) -> float:
        if flex:
            return self._flex.queue_timeout_seconds
        if patient:
            return self._patient.queue_timeout_seconds
        return self._settings.queue_timeout_seconds


def _flow_settings(flow: FlowAdmission, tier: TierAdmission) -> PatientAdmission:
    """The patient lane's controller, set to govern a whole tier (PatientLane's docs)."""
    return PatientAdmission(
        adaptive=True,
        max_concurrent=tier.max_concurrent,
        min_concurrent=min(flow.min_concurrent, tier.max_concurrent),
        max_queue=tier.max_queue,
        target_slowdown=flow.target_slowdown,
        judge_ttft=flow.judge_ttft,
        adjust_seconds=flow.adjust_seconds,
        quiet_seconds=flow.quiet_seconds,
        reference_samples=flow.reference_samples,
    )


def _each(settings: AdmissionSettings) -> list[tuple[Tier, TierAdmission]]:
    return [(tier, settings.tiers.get(tier, TierAdmission())) for tier in Tier]
