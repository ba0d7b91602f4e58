"""A gate: at most ``capacity`` holders, the rest waiting in priority order; and the slots
one request holds (a ticket)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from dataclasses import dataclass, field


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
        # Past a lowered capacity the slot is not passed on: the gate shrinks to it.
        if self.active <= self.capacity and self._hand_over():
            return
        self.active -= 1

    def resize(self, capacity: int) -> None:
        """A new capacity: holders over a lower one keep their slots until they leave;
        waiters get the slots a higher one frees, in their order."""
        self.capacity = capacity
        while self.active < self.capacity and self._hand_over():
            self.active += 1

    def _hand_over(self) -> bool:
        while self._queue:
            waiter = heapq.heappop(self._queue)
            if not waiter.future.done():
                waiter.future.set_result(None)  # the slot passes straight to the waiter
                return True
        return False


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
