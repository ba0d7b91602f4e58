"""Admission in front of each tier's pool: a cap on requests in flight, a bounded priority
queue behind it, and separate caps for the long-context lane and the flex lane.

A full queue is the gateway's capacity, not the caller's limit: it answers 503 with
``retry-after`` (429 is kept for the caller's own limits). The flex lane is the exception,
as at OpenAI: a flex request that finds its lane full, or waits past the lane's (long)
timeout, gets 429 ``resource_unavailable`` with ``retry-after``.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from dataclasses import dataclass, field

from tiergate.gateway.errors import OpenAIError
from tiergate.settings import AdmissionSettings, TierAdmission
from tiergate.tiers import Tier


@dataclass(order=True)
class _Waiter:
    sort_key: tuple[int, int]
    future: asyncio.Future[None] = field(compare=False)


class Gate:
    """At most ``capacity`` holders; the rest wait in priority order, at most ``max_queue``."""

    def __init__(self, capacity: int, max_queue: int) -> None:
        self.capacity = capacity
        self.max_queue = max_queue
        self.active = 0
        self._queue: list[_Waiter] = []
        self._seq = itertools.count()

    @property
    def queued(self) -> int:
        return sum(1 for w in self._queue if not w.future.done())

    def try_enter(self) -> bool:
        if self._queue and self.queued == 0:
            self._queue.clear()  # only abandoned waiters were left
        if self.active < self.capacity and not self._queue:
            self.active += 1
            return True
        return False

    async def enter(self, priority: int, wait_seconds: float) -> None:
        """Wait for a slot; raises ``LookupError`` when the queue is full and
        ``TimeoutError`` when the wait is too long."""
        if self.try_enter():
            return
        if self.queued >= self.max_queue:
            raise LookupError("queue full")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._queue, _Waiter((-priority, next(self._seq)), future))
        try:
            async with asyncio.timeout(wait_seconds):
                await future
        except BaseException:
            if future.done() and not future.cancelled():
                self.leave()  # the slot was handed over just as we gave up: pass it on
            else:
                future.cancel()
            raise

    def leave(self) -> None:
        while self._queue:
            waiter = heapq.heappop(self._queue)
            if not waiter.future.done():
                waiter.future.set_result(None)  # the slot passes straight to the waiter
                return
        self.active -= 1


@dataclass(slots=True)
class Ticket:
    """Slots held by one request; released exactly once when its response ends."""

    gates: list[Gate]
    waited_seconds: float
    _released: bool = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            for gate in reversed(self.gates):
                gate.leave()


class Admission:
    """The per-tier gates and the long-context lane's gates."""

    def __init__(self, settings: AdmissionSettings, designated_long: dict[Tier, bool]) -> None:
        self._settings = settings
        self._flex = settings.flex
        self.tiers = {
            tier: Gate(cfg.max_concurrent, cfg.max_queue) for tier, cfg in _each(settings)
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
        self.flex = {tier: Gate(self._flex.max_concurrent, self._flex.max_queue) for tier in Tier}

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
    ) -> Ticket:
        """Slots on ``tier`` (and its lanes), waiting at most ``wait_seconds`` in all (the
        flex lane's timeout for flex, else the queue timeout); refused as the module says."""
        gate = self.tiers[tier]
        lanes: list[tuple[Gate, str]] = []
        if flex:
            lanes.append((self.flex[tier], "flex lane"))
        if long_prompt and tier in self.long:
            lanes.append((self.long[tier], "long-context lane"))
        if not lanes and gate.try_enter():
            return Ticket([gate], 0.0)  # a free slot and no queue: nothing to wait for
        if wait_seconds is None:
            wait_seconds = (
                self._flex.queue_timeout_seconds if flex else self._settings.queue_timeout_seconds
            )
        started = time.perf_counter()
        deadline = started + wait_seconds
        gates: list[Gate] = []
        try:
            for lane, what in [*lanes, (gate, "tier")]:
                await self._enter(lane, tier, priority, what, deadline, flex)
                gates.append(lane)
        except BaseException:
            for held in reversed(gates):
                held.leave()
            raise
        return Ticket(gates, time.perf_counter() - started)

    async def _enter(
        self, gate: Gate, tier: Tier, priority: int, what: str, deadline: float, flex: bool
    ) -> None:
        wait = max(0.0, deadline - time.perf_counter())
        try:
            await gate.enter(priority, wait)
        except LookupError:
            raise self._refusal(f"The {tier.value} {what} is at capacity", "1", flex) from None
        except TimeoutError:
            waited = f"Waited {self._wait_of(flex):g}s for the {tier.value} {what}"
            raise self._refusal(waited, "2", flex) from None

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

    def _wait_of(self, flex: bool) -> float:
        return self._flex.queue_timeout_seconds if flex else self._settings.queue_timeout_seconds


def _each(settings: AdmissionSettings) -> list[tuple[Tier, TierAdmission]]:
    return [(tier, settings.tiers.get(tier, TierAdmission())) for tier in Tier]
