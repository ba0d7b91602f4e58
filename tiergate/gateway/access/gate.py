"""A gate: at most ``capacity`` holders, the rest waiting; and the slots one request holds
(a ticket).

Who gets a slot that frees: the waiters of the highest priority first (strict bands), and
among them the owner (tenant) that has been served the fewest weighted tokens recently, as
``served`` says (tiergate.gateway.access.fairshare); an owner's own waiters in arrival
order. Without ``served``, arrival order within a band.

``reserve``: slots beyond the capacity for owners that hold next to none. An interactive
request (``may_exceed``) of a tenant with at most one request in flight and none waiting
(a client that sends one after another often sends the next before the gateway has ended
the last; a tenant with a backlog is not quiet, and its requests keep their order) is let
in at once even when the gate is full, while fewer than ``reserve`` such slots are held,
so that a tenant that floods never makes another tenant's next request wait for one of
the flood's to end, even just after flow control lowered the capacity under what the flood
holds. It costs the engines at most ``reserve`` requests over the limit. A slot let in so
is not passed on when it ends while the gate is over its capacity. The unnamed owner
``""`` (a gateway without keys: one tenant, nobody to keep a slot for) gets none.

``linger``: a slot that a quiet tenant's request (the tenant's only one in flight) leaves
while other tenants wait is kept for that tenant's next request for ``linger`` seconds
before it is handed over. A client that sends one request after another sends the next
within milliseconds of the last one's end; handed over at once, the slot starts one of a
flood's waiting requests at that same moment, so that every one of the quiet tenant's
requests met a new flood request's prefill on the engine, and its time to first token
doubled (measured on a 2-core AMD EPYC Zen 5, docs/access.md: 2.4x its time alone with the
slot handed over at once, 1.3x when its requests came at random moments). Kept, the
tenant's next request takes it at once and the flood's requests start when the flood's own
end. It costs at most ``linger`` seconds of one slot per such request that is not followed
by another, and nothing while no one waits.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

Served = Callable[[str], float]


@dataclass(eq=False, slots=True)
class _Waiter:
    seq: int
    owner: str
    future: asyncio.Future[None] = field(repr=False)


class Gate:
    """At most ``capacity`` holders; the rest wait (at most ``max_queue``) as the module
    says."""

    def __init__(
        self,
        capacity: int,
        max_queue: int,
        *,
        served: Served | None = None,
        reserve: int = 0,
        linger: float = 0.0,
    ) -> None:
        self.capacity = capacity
        self.max_queue = max_queue
        self.reserve = reserve
        self.linger = linger
        # Slots kept for a quiet owner's next request (counted in ``active``), with the
        # timer that hands each over when it is not taken.
        self._kept: dict[str, asyncio.TimerHandle] = {}
        # The priority each owner holding a slot entered at last: a slot is not kept for
        # an owner while a waiter of a higher band waits (bands stay strict).
        self._band: dict[str, int] = {}
        self.active = 0
        self.queued = 0
        self._served = served
        self._held: dict[str, int] = {}
        # The reserve's slots held, by owner (fewer than ``reserve`` in all when one is
        # taken).
        self._extra: dict[str, int] = {}
        # priority -> owner -> that owner's waiters of that priority, in arrival order.
        self._waiting: dict[int, dict[str, deque[_Waiter]]] = {}
        self._seq = itertools.count()

    def held(self, owner: str) -> int:
        return self._held.get(owner, 0)

    def owners(self) -> set[str]:
        """The owners holding or waiting for a slot."""
        waiting = {owner for owners in self._waiting.values() for owner in owners}
        return waiting | set(self._held)

    def try_enter(self, owner: str = "", may_exceed: bool = False, priority: int = 0) -> bool:
        kept = self._kept.pop(owner, None)
        if kept is not None:  # the slot its last request left, kept for it (``linger``)
            kept.cancel()
            self._held[owner] = self._held.get(owner, 0) + 1
            self._band[owner] = priority
            return True
        # A free slot means no waiter could take it (every leave and resize hands a free
        # slot to a waiter), so none is passed by.
        if self.active < self.capacity:
            self._take(owner, priority)
            return True
        if (
            may_exceed
            and owner
            and self._held.get(owner, 0) <= 1
            and sum(self._extra.values()) < self.reserve
            and not any(owner in owners for owners in self._waiting.values())
        ):
            self._extra[owner] = self._extra.get(owner, 0) + 1
            self._take(owner, priority)
            return True
        return False

    def _take(self, owner: str, priority: int) -> None:
        self.active += 1
        self._held[owner] = self._held.get(owner, 0) + 1
        self._band[owner] = priority

    async def enter(
        self, priority: int, wait_seconds: float, owner: str = "", may_exceed: bool = False
    ) -> None:
        """Wait for a slot; raises ``LookupError`` when the queue is full and
        ``TimeoutError`` when the wait is too long."""
        if self.try_enter(owner, may_exceed, priority):
            return
        if self.queued >= self.max_queue:
            raise LookupError("queue full")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(next(self._seq), owner, future)
        self._waiting.setdefault(priority, {}).setdefault(owner, deque()).append(waiter)
        self.queued += 1
        try:
            async with asyncio.timeout(wait_seconds):
                await future
        except BaseException:
            if future.done() and not future.cancelled():
                self.leave(owner)  # the slot was handed over just as we gave up: pass it on
            else:
                future.cancel()
                self._drop(priority, waiter)
            raise

    def leave(self, owner: str = "") -> None:
        _decrement(self._held, owner)
        _decrement(self._extra, owner)
        band = self._band.get(owner, 0) if owner in self._held else self._band.pop(owner, 0)
        if self.active <= self.capacity and self._keep(owner, band):
            return
        self._pass_on()

    def _pass_on(self) -> None:
        """A slot freed: to the next waiter, or, past a lowered capacity or with none
        waiting, back to the gate (which shrinks to its capacity)."""
        if self.active <= self.capacity and self._hand_over():
            return
        self.active -= 1

    def _keep(self, owner: str, band: int) -> bool:
        """Keep the slot ``owner`` just left (at priority ``band``) for its next request
        (the module's ``linger``): a named owner now holding none, with no waiters of its
        own, while others of its band or below wait for a slot (a higher band's waiter
        gets it at once)."""
        if (
            self.linger <= 0
            or not owner
            or not self._waiting
            or max(self._waiting) > band
            or owner in self._held
            or owner in self._kept
            or any(owner in owners for owners in self._waiting.values())
        ):
            return False
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called outside the event loop (a simulation): no timer
            return False
        self._kept[owner] = loop.call_later(self.linger, self._expire, owner)
        return True

    def _expire(self, owner: str) -> None:
        """The kept slot was not taken in time: passed on as any freed slot."""
        if self._kept.pop(owner, None) is not None:
            self._pass_on()

    def resize(self, capacity: int) -> None:
        """A new capacity: holders over a lower one keep their slots until they leave;
        waiters get the slots a higher one frees, in their order."""
        self.capacity = capacity
        while self.active < self.capacity and self._hand_over():
            self.active += 1

    def _hand_over(self) -> bool:
        """Give a slot to the next waiter that may hold one (the module's order)."""
        for priority in sorted(self._waiting, reverse=True):
            owners = self._waiting[priority]
            best: tuple[float, int] | None = None
            chosen = ""
            for owner, waiters in owners.items():
                rank = (self._served(owner) if self._served else 0.0, waiters[0].seq)
                if best is None or rank < best:
                    best, chosen = rank, owner
            if best is None:
                continue  # (an empty band is deleted, so this is not reached)
            waiters = owners[chosen]
            waiter = waiters.popleft()
            if not waiters:
                del owners[chosen]
                if not owners:
                    del self._waiting[priority]
            self.queued -= 1
            self._held[chosen] = self._held.get(chosen, 0) + 1
            self._band[chosen] = priority
            waiter.future.set_result(None)  # the slot passes straight to the waiter
            return True
        return False

    def _drop(self, priority: int, waiter: _Waiter) -> None:
        """A waiter that gave up (timed out, or its caller went away) leaves the queue."""
        owners = self._waiting.get(priority)
        waiters = owners.get(waiter.owner) if owners else None
        if owners is None or waiters is None or waiter not in waiters:
            return
        waiters.remove(waiter)
        self.queued -= 1
        if not waiters:
            del owners[waiter.owner]
            if not owners:
                del self._waiting[priority]


def _decrement(counts: dict[str, int], owner: str) -> None:
    left = counts.get(owner, 0) - 1
    if left > 0:
        counts[owner] = left
    else:
        counts.pop(owner, None)


@dataclass(slots=True)
class Ticket:
    """Slots held by one request (for its owner); released exactly once when its response
    ends."""

    gates: list[Gate]
    waited_seconds: float
    owner: str = ""
    _released: bool = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            for gate in reversed(self.gates):
                gate.leave(self.owner)
