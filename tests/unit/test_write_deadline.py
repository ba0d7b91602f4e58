"""A relay's write deadline (tiergate.gateway.openai.relay._WriteDeadline): one timer per answer
cuts the write that waits ``seconds``, at that moment, and never a client that is slow
but takes each write in time."""

from __future__ import annotations

import asyncio

from tiergate.gateway.openai.relay import _WriteDeadline

# Margins of 150 ms or more: a pause of the process longer than a margin would fire both
# timers in one turn of the loop, and a busy CI machine can pause a test that long.
SECONDS = 0.9


async def _writes(deadline: _WriteDeadline, takes: list[float]) -> None:
    """Writes that each take the client ``takes[i]`` seconds, back to back."""
    for seconds in takes:
        deadline.since = deadline.loop.time()
        try:
            await asyncio.sleep(seconds)
        finally:
            deadline.since = None


async def test_a_slow_client_that_takes_each_write_in_time_is_never_cut() -> None:
    deadline = _WriteDeadline(SECONDS)
    # Eight writes of 0.6 s (4.8 s in all, five deadlines long), with pauses between.
    task = asyncio.ensure_future(_writes(deadline, [0.6, 0.0, 0.6, 0.6, 0.3, 0.6, 0.6, 0.75]))
    deadline.watch(task)
    await task
    deadline.stop()
    assert not deadline.stalled


async def test_the_write_that_waits_too_long_is_cut_when_its_deadline_passes() -> None:
    deadline = _WriteDeadline(SECONDS)
    loop = asyncio.get_running_loop()
    started = loop.time()
    task = asyncio.ensure_future(_writes(deadline, [0.6, 0.75, 15.0]))
    deadline.watch(task)
    await asyncio.wait([task])
    deadline.stop()
    assert deadline.stalled and task.cancelled()
    # The third write began at about 1.35 s: it is cut about 0.9 s later, not at a
    # multiple of the timer's period.
    assert 2.2 <= loop.time() - started < 2.85


async def test_stopped_it_cuts_nothing() -> None:
    deadline = _WriteDeadline(0.05)
    task = asyncio.ensure_future(_writes(deadline, [0.3]))
    deadline.watch(task)
    deadline.stop()
    await task
    assert not deadline.stalled
