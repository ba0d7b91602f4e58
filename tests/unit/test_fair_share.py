"""Token-weighted fairness and the per-tenant reserve in the admission gate (issue 52 items
1-2; tiergate.gateway.access.gate, tiergate.gateway.access.fairshare).

A tenant that floods within its own limits must not make a quiet tenant of the same
priority wait behind it: the quiet one's next request takes a reserved slot at once, and
when slots free, the tenant served the fewest weighted tokens recently gets the next one.
With both saturating, each gets its weight's share of tokens. The engine here is a fake:
a discrete-event simulation on a logical clock (each request holds its slot for as long as
its tokens take), driving the real gate and the real counters."""

from __future__ import annotations

import asyncio
import heapq
import itertools

import pytest

from tiergate.accesssettings import FairShareSettings
from tiergate.gateway.access.fairshare import ServedTokens
from tiergate.gateway.access.gate import Gate


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_quiet_tenant_is_next_in_line_ahead_of_a_floods_queue() -> None:
    clock = Clock()
    served = ServedTokens(FairShareSettings(), "t", clock)
    gate = Gate(2, 64, served=served.served)
    for _ in range(2):
        assert gate.try_enter("a")
        served.charge("a", 500)
    flood = [asyncio.create_task(gate.enter(0, 30, "a")) for _ in range(5)]
    await _settle()
    quiet = asyncio.create_task(gate.enter(0, 30, "b"))  # arrives after all of a's
    await _settle()
    assert gate.queued == 6
    gate.leave("a")  # one of a's requests ends
    await _settle()
    assert quiet.done(), "the slot went to the flood's next request, not the quiet tenant's"
    assert not any(t.done() for t in flood)
    for task in flood:
        task.cancel()
    await _settle()
    assert gate.queued == 0


async def test_a_tenant_with_next_to_nothing_in_flight_is_let_in_beside_a_flood() -> None:
    gate = Gate(4, 64, reserve=2)
    assert [gate.try_enter("a", may_exceed=True) for _ in range(5)] == [True] * 4 + [False]
    assert gate.try_enter("b", may_exceed=True), "the second tenant found no slot"
    # Its next request, sent before the gateway ended the last, is let in too...
    assert gate.try_enter("b", may_exceed=True)
    assert not gate.try_enter("b", may_exceed=True)  # ...but not a third
    assert not gate.try_enter("c", may_exceed=True)  # the reserve is held
    assert not gate.try_enter("d")  # patient work never takes it
    gate.leave("b")
    gate.resize(2)  # flow control cuts under what the flood holds: c still gets in
    assert gate.try_enter("c", may_exceed=True)
    gate.leave("b")
    assert gate.active == 5  # b's slot was not passed on over the capacity
    # A tenant with a backlog is not quiet: its next request waits its turn.
    busy = Gate(1, 64, reserve=2)
    assert busy.try_enter("a", may_exceed=True)
    backlog = asyncio.create_task(busy.enter(0, 30, "a"))
    await _settle()
    busy.leave("a")  # the backlog's request takes the slot: a holds one, none waiting
    await _settle()
    assert backlog.done()
    late = asyncio.create_task(busy.enter(0, 30, "a"))  # waits: the gate is full
    await _settle()
    assert not busy.try_enter("a", may_exceed=True)  # a has one waiting: no reserve
    late.cancel()
    await _settle()
    # Without keys there is one tenant and nobody to keep a slot for.
    solo = Gate(1, 64, reserve=2)
    assert solo.try_enter("", may_exceed=True)
    assert not solo.try_enter("", may_exceed=True)


async def test_a_quiet_tenants_slot_waits_for_its_next_request_not_the_floods() -> None:
    """A tenant sending one request after another: the slot its request leaves is not
    handed to a flood's waiter at the moment its next request comes (which made every one
    of its requests meet a new flood request's prefill: 2.4x its time to first token)."""
    linger = 0.2
    gate = Gate(2, 64, reserve=0, linger=linger)
    assert gate.try_enter("a") and gate.try_enter("b")
    flood = [asyncio.create_task(gate.enter(0, 30, "a")) for _ in range(3)]
    await _settle()
    gate.leave("b")  # b's request ends while a's wait
    await _settle()
    assert not any(t.done() for t in flood), "the quiet tenant's slot went to the flood"
    assert gate.active == 2 and gate.try_enter("b"), "b's next request found its slot gone"
    assert gate.active == 2 and gate.queued == 3
    # Not followed by another: handed over once the linger is up, not lost.
    gate.leave("b")
    started = asyncio.get_running_loop().time()
    while not any(t.done() for t in flood):
        assert asyncio.get_running_loop().time() - started < 5, "the kept slot was lost"
        await asyncio.sleep(0.01)
    assert asyncio.get_running_loop().time() - started >= linger * 0.9
    assert sum(t.done() for t in flood) == 1 and gate.active == 2 and gate.queued == 2
    # A tenant holding more than one, or with a backlog, is not quiet: passed on at once.
    assert not gate.try_enter("b")
    gate.leave("a")  # a holds two; its slot goes to its own next waiter
    await _settle()
    assert sum(t.done() for t in flood) == 2
    for task in flood:
        task.cancel()
    await _settle()
    # Nobody waiting: the slot is simply free (nothing kept, nothing idle).
    idle = Gate(1, 64, linger=linger)
    assert idle.try_enter("b")
    idle.leave("b")
    assert idle.active == 0 and idle.try_enter("c")
    # Over a lowered capacity the gate shrinks instead; without keys nothing is kept.
    cut = Gate(2, 64, linger=linger)
    assert cut.try_enter("a") and cut.try_enter("b")
    waiting = asyncio.create_task(cut.enter(0, 30, "a"))
    await _settle()
    cut.resize(1)
    cut.leave("b")
    assert cut.active == 1 and not cut.try_enter("b")
    # A waiter of a higher band than the quiet tenant's gets the slot at once: bands stay
    # strict (with the reserve, b's next request is still let in beside it).
    banded = Gate(1, 64, reserve=1, linger=linger)
    assert banded.try_enter("b", priority=0)
    urgent = asyncio.create_task(banded.enter(5, 30, "a"))
    await _settle()
    banded.leave("b")
    await _settle()
    assert urgent.done(), "a higher band waited for a lower band's kept slot"
    assert banded.try_enter("b", may_exceed=True, priority=0)
    same = Gate(1, 64, linger=linger)
    assert same.try_enter("b", priority=5)
    lower = asyncio.create_task(same.enter(5, 30, "a"))
    await _settle()
    same.leave("b")
    await _settle()
    assert not lower.done() and same.try_enter("b", priority=5)  # its own band: kept
    lower.cancel()
    solo = Gate(1, 64, linger=linger)
    assert solo.try_enter("")
    queued = asyncio.create_task(solo.enter(0, 30, ""))
    await _settle()
    solo.leave("")
    await _settle()
    assert queued.done()
    waiting.cancel()
    await _settle()


async def test_priority_bands_stay_strict_over_fair_shares() -> None:
    clock = Clock()
    served = ServedTokens(FairShareSettings(), "t", clock)
    gate = Gate(1, 64, served=served.served)
    assert gate.try_enter("x")
    served.charge("busy", 10_000)
    low = asyncio.create_task(gate.enter(0, 30, "idle"))
    high = asyncio.create_task(gate.enter(5, 30, "busy"))
    await _settle()
    gate.leave("x")
    await _settle()
    assert high.done() and not low.done()
    low.cancel()
    await _settle()


async def test_a_tenant_quiet_for_a_window_starts_again_at_zero() -> None:
    clock = Clock()
    served = ServedTokens(FairShareSettings(window_seconds=60), "t", clock)
    served.charge("a", 1000)
    assert served.served("a") == pytest.approx(1000)
    clock.now += 60
    assert 0 < served.served("a") < 1000  # the previous period, partly inside the window
    clock.now += 60
    assert served.served("a") == 0
    served.charge("b", 30, weight=3)  # a weight of 3: a third of the count
    assert served.served("b") == pytest.approx(10)


async def _simulate(
    tenants: dict[str, tuple[int, int, float]], capacity: int, seconds: float
) -> dict[str, float]:
    """Each tenant keeps ``outstanding`` requests of ``output`` tokens waiting or running
    (its weight given); a request holds its slot for its tokens at one token per logical
    millisecond. Returns each tenant's weighted tokens served."""
    clock = Clock()
    settings = FairShareSettings(window_seconds=30)
    served = ServedTokens(settings, "t", clock)
    gate = Gate(capacity, 10_000, served=served.served)
    ends: list[tuple[float, int, str]] = []
    seq = itertools.count()
    tally = dict.fromkeys(tenants, 0.0)
    prompt = 20

    async def one(owner: str) -> None:
        await gate.enter(0, 1e9, owner)
        _, output, weight = tenants[owner]
        served.charge(owner, served.tokens(prompt, 0), weight)  # the prompt, at admission
        heapq.heappush(ends, (clock.now + output / 1000, next(seq), owner))

    tasks = [
        asyncio.create_task(one(owner))
        for owner, (outstanding, _, _) in tenants.items()
        for _ in range(outstanding)
    ]
    await _settle()
    stop = clock.now + seconds
    while ends and clock.now < stop:
        clock.now, _, owner = heapq.heappop(ends)
        _, output, weight = tenants[owner]
        served.charge(owner, served.tokens(0, output), weight)  # the output, at the end
        tally[owner] += served.tokens(prompt, output)
        gate.leave(owner)
        tasks.append(asyncio.create_task(one(owner)))  # the tenant sends its next one
        await _settle()
    for task in tasks:
        task.cancel()
    await _settle()
    return tally


async def test_two_saturating_tenants_share_tokens_by_weight_whatever_their_sizes() -> None:
    # a sends answers four times b's length: by requests it would get 4/5 of the tokens.
    tally = await _simulate({"a": (16, 400, 1.0), "b": (16, 100, 1.0)}, 6, 120)
    share = tally["a"] / (tally["a"] + tally["b"])
    assert share == pytest.approx(0.5, rel=0.1), tally
    # Weights 2:1, the same sizes: two thirds and one third.
    tally = await _simulate({"a": (16, 200, 2.0), "b": (16, 200, 1.0)}, 6, 120)
    share = tally["a"] / (tally["a"] + tally["b"])
    assert share == pytest.approx(2 / 3, rel=0.1), tally


def test_flow_control_judges_the_engines_first_token_not_its_own_queue() -> None:
    """The time a request waited for the tier's slot is the gateway's own queue, which flow
    control makes: counted in the time to first token it judges, a queue it held read as a
    slower engine and cut the limit again, down to its floor."""
    from tiergate.accesssettings import LimitSettings
    from tiergate.gateway.access.auth import Caller
    from tiergate.gateway.access.gate import Ticket
    from tiergate.gateway.access.gatekeeper import Lease
    from tiergate.gateway.access.limits import Limiter
    from tiergate.gateway.access.policy import Reason, TierChoice
    from tiergate.tiers import Tier

    heard: list[tuple[float, float]] = []

    class Controller:
        def observe(
            self, tpot: float, ttft: float, prompt: int, at_start: int, owner: str = ""
        ) -> None:
            heard.append((tpot, ttft))

    lease = Lease(
        Caller("k", None),
        Limiter(LimitSettings()),
        "req",
        10,
        TierChoice(Tier.STANDARD, Reason.REQUESTED),
        ticket=Ticket([], waited_seconds=2.0),
    )
    lease.flow = Controller()  # type: ignore[assignment]
    lease.observe_answer(Tier.STANDARD, 0.02, 2.05)
    assert heard == [(0.02, pytest.approx(0.05))]
