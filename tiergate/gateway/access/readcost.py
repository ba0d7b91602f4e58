"""What an owner's reads of its jobs and batches cost, held to a budget a minute.

Reads are where a tenant's polling becomes everyone's cost: ``GET /v1/jobs?limit=100`` is
a LIST and up to 200 object reads, one read of a 20,000-rollout batch parses 7 MB on the
gateway, and a key may hold 16 event streams polling. So every such read runs metered
(:meth:`tiergate.objectstore.ObjectStore.metered`) and is charged to the owner's bucket in
**read units**: one per call to object storage, one per :data:`UNIT_BYTES` read.

The bucket is a token bucket in the shared limiter (:class:`tiergate.gateway.access.limits.Limiter`:
in Redis across replicas when configured, in this process otherwise), under a name of its
own per owner, so it never touches the key's request or token limits. A read starts when
the bucket holds at least one unit and is then charged what it really cost, which may
take the bucket below zero: a costly read delays the owner's next ones, never another
owner's. Past the budget a request is a 429 (``read_rate_limited``, with Retry-After); a
stream or an export waits instead, and goes on once the bucket refills.

A read's cost is known only once it has run, so a key's reads are also bounded in flight
(``jobs.max_reads_in_flight_per_key`` on each replica): 200 parallel lists of 10,000
files were all admitted before any was charged, and every tenant's reads waited behind
them for the storage threads. Past the bound a request is a 429
(``too_many_concurrent_reads``) and a stream waits; the overdraft of a key's budget is at
most that many reads' cost.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from tiergate.accesssettings import KeyLimits
from tiergate.gateway.access.auth import Caller
from tiergate.gateway.access.limits import Decision, Limiter
from tiergate.gateway.errors import OpenAIError
from tiergate.objectstore import Meter, ObjectStore

# Bytes are charged for what parsing them costs the gateway: a 7 MB batch state is 260 ms
# of a core, some 900 units, where a GET of a small object is one or two.
UNIT_BYTES = 8 * 1024
# A waiting stream looks at the bucket again at least this often, at most this rarely.
_MIN_WAIT_SECONDS = 0.1
_MAX_WAIT_SECONDS = 5.0

_T = TypeVar("_T")
# Runs a blocking function off the event loop (the caller's thread pool, with its own
# error mapping).
Run = Callable[..., Awaitable[Any]]


def units(meter: Meter) -> int:
    """The read units a metered call cost."""
    return meter.calls + math.ceil(meter.read_bytes / UNIT_BYTES)


class ReadBudget:
    """Each owner's read budget on this gateway (one per app)."""

    def __init__(
        self, limiter: Limiter, objects: ObjectStore, per_minute: int, in_flight: int = 4
    ) -> None:
        self._limiter = limiter
        self._objects = objects
        self._per_minute = per_minute
        self._most_in_flight = in_flight
        self._in_flight: dict[str, int] = {}

    def _limits(self, caller: Caller) -> KeyLimits:
        own = caller.key.limits.read_units_per_minute if caller.key else None
        return KeyLimits(tokens_per_minute=own or self._per_minute)

    @staticmethod
    def _bucket(caller: Caller) -> str:
        return f"reads/{caller.owner}"

    async def _admit(self, caller: Caller) -> tuple[Decision, str]:
        request_id = uuid.uuid4().hex
        decision = await self._limiter.admit(
            self._bucket(caller), self._limits(caller), 1, request_id
        )
        return decision, request_id

    async def read(self, caller: Caller, run: Run, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` through ``run``, charged to the caller's owner; a 429 when the
        budget is spent, or when the owner has its most reads in flight."""
        if not self._enter(caller.owner):
            raise OpenAIError(
                429,
                f"This key has {self._most_in_flight} reads of its jobs, files and batches "
                "running on this gateway, its most at once (jobs.max_reads_in_flight_per_key); "
                "retry when one has finished.",
                code="too_many_concurrent_reads",
                type_="rate_limit_error",
                headers={"retry-after": "1"},
            )
        try:
            return await self._read(caller, run, fn, *args)
        finally:
            self._leave(caller.owner)

    async def _read(self, caller: Caller, run: Run, fn: Callable[..., _T], *args: Any) -> _T:
        decision, request_id = await self._admit(caller)
        if not decision.allowed:
            seconds = max(1, math.ceil(decision.retry_after_ms / 1000))
            per_minute = self._limits(caller).tokens_per_minute
            raise OpenAIError(
                429,
                f"This key's reads of its jobs and batches are over their budget "
                f"({per_minute} read units a minute, jobs.read_units_per_minute); "
                f"try again in {seconds} s, or follow the job's events instead of polling.",
                code="read_rate_limited",
                type_="rate_limit_error",
                headers={"retry-after": str(seconds)},
            )
        return await self._charged(caller, decision, request_id, run, fn, *args)

    async def read_when_allowed(
        self, caller: Caller, run: Run, fn: Callable[..., _T], *args: Any
    ) -> _T:
        """``fn(*args)`` once the caller's owner can afford it (a stream's next poll, an
        export's next record): waits while the budget is spent."""
        # Polled, as the budget is below: a stream's reads are seconds apart anyway.
        while not self._enter(caller.owner):  # noqa: ASYNC110
            await asyncio.sleep(_MIN_WAIT_SECONDS)
        try:
            while True:
                decision, request_id = await self._admit(caller)
                if decision.allowed:
                    return await self._charged(caller, decision, request_id, run, fn, *args)
                wait = decision.retry_after_ms / 1000
                await asyncio.sleep(min(max(wait, _MIN_WAIT_SECONDS), _MAX_WAIT_SECONDS))
        finally:
            self._leave(caller.owner)

    def _enter(self, owner: str) -> bool:
        """One of ``owner``'s reads in flight, if it has fewer than its most."""
        held = self._in_flight.get(owner, 0)
        if held >= self._most_in_flight:
            return False
        self._in_flight[owner] = held + 1
        return True

    def _leave(self, owner: str) -> None:
        left = self._in_flight[owner] - 1
        if left:
            self._in_flight[owner] = left
        else:
            del self._in_flight[owner]

    async def _charged(
        self,
        caller: Caller,
        decision: Decision,
        request_id: str,
        run: Run,
        fn: Callable[..., _T],
        *args: Any,
    ) -> _T:
        cost = 1
        try:
            result, meter = await run(self._objects.metered, fn, *args)
            cost = units(meter)
            return result  # type: ignore[no-any-return]
        finally:
            self._limiter.settle(self._bucket(caller), cost - 1, request_id, decision.shared)
