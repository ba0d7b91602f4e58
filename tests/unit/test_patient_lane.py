"""The patient lane's limit (tiergate.gateway.access.patience) on a fake clock, and the gate
it resizes: what an operator would check on /metrics, driven by the TPOT samples the proxy
hands it."""

from __future__ import annotations

import asyncio

import pytest

from tiergate.accesssettings import PatientAdmission
from tiergate.gateway.access.gate import Gate
from tiergate.gateway.access.patience import PatientLane


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _lane(**overrides: object) -> tuple[PatientLane, Clock]:
    clock = Clock()
    settings = PatientAdmission.model_validate(
        {"max_concurrent": 32, "min_concurrent": 1, "adjust_seconds": 1.0, **overrides}
    )
    return PatientLane(settings, clock), clock


def _fill(lane: PatientLane, n: int) -> None:
    for _ in range(n):
        assert lane.gate.try_enter()


def _window(
    lane: PatientLane,
    clock: Clock,
    tpot: float,
    at_start: int,
    ttft: float | None = None,
    prompt_tokens: int = 50,
) -> None:
    """One adjustment window's interactive streams (TTFT, unless given, 1.5x the TPOT)."""
    first = tpot * 1.5 if ttft is None else ttft
    for _ in range(3):
        lane.observe(tpot, first, prompt_tokens, at_start)
    clock.now += 1.0
    lane.observe(tpot, first, prompt_tokens, at_start)


def test_without_a_reference_the_lane_falls_to_its_floor_to_measure_one() -> None:
    lane, clock = _lane()
    _fill(lane, 20)
    _window(lane, clock, 0.050, at_start=20)
    assert lane.limit == 1
    assert lane.slowdown is None


def test_slowdown_over_the_target_cuts_the_limit_down_to_the_floor() -> None:
    lane, clock = _lane()
    _window(lane, clock, 0.030, at_start=0)  # alone: the reference, 30 ms
    assert lane.slowdown == pytest.approx(1.0)
    _fill(lane, 32)
    limits = []
    for _ in range(10):
        _window(lane, clock, 0.060, at_start=32)  # 2x the reference
        limits.append(lane.limit)
    assert limits == [22, 15, 10, 7, 4, 2, 1, 1, 1, 1]  # 0.7 of itself each window
    assert lane.slowdown == pytest.approx(2.0)
    # Holders above the new limit keep their slots: nothing is cut, the next ones wait.
    assert lane.gate.active == 32
    assert not lane.gate.try_enter()


def test_within_the_target_a_full_lane_grows_and_an_idle_one_does_not() -> None:
    lane, clock = _lane(min_concurrent=2)
    _window(lane, clock, 0.030, at_start=0)
    lane.gate.resize(8)
    _fill(lane, 3)
    _window(lane, clock, 0.033, at_start=3)  # 1.1x, but the lane is not full
    assert lane.limit == 8
    _fill(lane, 5)
    _window(lane, clock, 0.033, at_start=8)
    assert lane.limit == 9  # an eighth of 8, at least one
    _fill(lane, 1)
    for _ in range(6):
        _fill(lane, lane.limit - lane.gate.active)
        _window(lane, clock, 0.033, at_start=lane.gate.active)
    assert lane.limit == 15  # one a window while an eighth is under one


def test_the_reference_is_only_what_ran_beside_no_more_than_the_floor() -> None:
    lane, clock = _lane(min_concurrent=2)
    _window(lane, clock, 0.030, at_start=2)  # the floor counts as the reference
    _fill(lane, 10)
    _window(lane, clock, 0.090, at_start=10)  # busy samples never become the reference
    assert lane.slowdown == pytest.approx(3.0)
    assert lane.limit == 7  # 0.7 of the 10 in flight: a cut above them would change nothing


def test_quiet_interactive_callers_give_the_patient_work_everything() -> None:
    lane, clock = _lane(quiet_seconds=5.0)
    _window(lane, clock, 0.030, at_start=0)
    _fill(lane, 32)
    for _ in range(10):
        _window(lane, clock, 0.090, at_start=32)
    assert lane.limit == 1
    clock.now += 4.0
    lane.tick()
    assert lane.limit == 1  # not quiet for long enough yet
    clock.now += 1.5
    lane.tick()
    assert lane.limit == 32


def test_first_tokens_slowed_count_though_decoding_is_not() -> None:
    lane, clock = _lane(judge_ttft=True)
    _window(lane, clock, 0.030, at_start=0, ttft=0.050)
    _fill(lane, 32)
    _window(lane, clock, 0.030, at_start=32, ttft=0.100)  # decoding as alone, TTFT 2x
    assert lane.slowdown == pytest.approx(2.0)
    assert lane.limit == 22


def test_a_first_token_is_compared_with_prompts_of_its_size() -> None:
    lane, clock = _lane(judge_ttft=True)
    _window(lane, clock, 0.030, at_start=0, ttft=0.050, prompt_tokens=50)
    _fill(lane, 32)
    # A prompt 40 times longer takes longer to its first token whatever runs beside it:
    # with no reference of its size only its TPOT is judged, and that is as alone.
    _window(lane, clock, 0.030, at_start=32, ttft=0.900, prompt_tokens=2000)
    assert lane.slowdown == pytest.approx(1.0)
    assert lane.limit == 32


def test_a_fixed_lane_ignores_the_samples() -> None:
    lane, clock = _lane(adaptive=False)
    _fill(lane, 32)
    _window(lane, clock, 0.900, at_start=32)
    clock.now += 60
    lane.tick()
    assert lane.limit == 32


def test_a_floor_over_the_ceiling_is_refused() -> None:
    with pytest.raises(ValueError, match="min_concurrent is over max_concurrent"):
        PatientAdmission(min_concurrent=9, max_concurrent=8)


def test_a_gate_raised_hands_its_new_slots_to_waiters_in_their_order() -> None:
    async def go() -> list[int]:
        gate = Gate(1, 10)
        assert gate.try_enter()
        order: list[int] = []

        async def wait(priority: int) -> None:
            await gate.enter(priority, 5.0)
            order.append(priority)

        tasks = [asyncio.create_task(wait(p)) for p in (1, 3, 2)]
        await asyncio.sleep(0)
        assert gate.queued == 3
        gate.resize(3)
        await asyncio.sleep(0)
        assert gate.active == 3 and gate.queued == 1
        gate.resize(1)  # lowered: the slots given back are not passed on ...
        gate.leave()
        gate.leave()
        await asyncio.sleep(0)
        assert gate.active == 1 and gate.queued == 1
        gate.leave()  # ... until the gate is under its capacity again
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(go()) == [3, 2, 1]


def test_first_tokens_are_not_judged_by_default() -> None:
    lane, clock = _lane()
    _window(lane, clock, 0.030, at_start=0, ttft=0.050)
    _fill(lane, 32)
    _window(lane, clock, 0.030, at_start=32, ttft=0.100)
    assert lane.slowdown == pytest.approx(1.0)
    assert lane.limit == 32


def test_one_tenant_with_many_fast_answers_does_not_outvote_the_others() -> None:
    """Attacker's test: the window's slowdown was the median of every sample, so one
    tenant sending many answers that look fast (short, or decoded side by side) held the
    lane open while every other tenant's streams ran 2x slower."""
    lane, clock = _lane()
    for owner in ("a", "b", "c"):
        lane.observe(0.030, 0.045, 50, 0, owner)  # alone: the reference, 30 ms
    clock.now += 1.0
    lane.observe(0.030, 0.045, 50, 0, "a")
    _fill(lane, 32)
    for _ in range(3):
        for _ in range(20):
            lane.observe(0.030, 0.045, 50, 32, "flooder")  # many, at the reference
        lane.observe(0.060, 0.090, 50, 32, "b")  # each other tenant: 2x slowed
        clock.now += 1.0
        lane.observe(0.060, 0.090, 50, 32, "c")
    assert lane.slowdown == pytest.approx(2.0)
    assert lane.limit == 10  # cut three times: 32 -> 22 -> 15 -> 10


def test_one_tenant_cannot_fill_the_reference_alone() -> None:
    """The reference is the median of each tenant's median: a tenant's many samples taken
    while the lane is at its floor weigh as one."""
    lane, clock = _lane()
    for owner in ("b", "c"):
        lane.observe(0.030, 0.045, 50, 0, owner)
    for _ in range(30):
        lane.observe(0.003, 0.005, 50, 0, "poisoner")  # n>1-like answers, 10x too fast
    clock.now += 1.0
    lane.observe(0.030, 0.045, 50, 0, "b")
    # The reference is the middle voice, 30 ms (b, c) not 3 ms (the poisoner's).
    assert lane.slowdown is not None and lane.slowdown < 2.0
