"""The soak's faults: a seeded schedule (printed before the run) of SIGKILLs, each
followed by the container's restart, and SIGSTOP/SIGCONT pauses; injected one at a time
by :func:`inject`, each recorded with when it began and when its target was back.

Besides: ``fill`` (a worker's workspace volume filled to its last byte, then emptied)
and ``slow`` (every chunk between the gateways or workers and the store delayed).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from tiergate.bench.soak.stack import SoakStack

# Every kind of fault the soak knows, by target: kill (then restart) or stop (then cont).
KINDS: tuple[tuple[str, str], ...] = (
    ("kill", "worker-1"),
    ("kill", "gateway-1"),
    ("kill", "engine-fast"),
    ("stop", "worker-2"),
    ("kill", "broker"),
    ("kill", "redis"),
    ("kill", "store"),
    ("kill", "engine-standard"),
    ("stop", "broker"),
    ("kill", "gateway-2"),
    ("kill", "worker-2"),
    ("fill", "worker-1"),
    ("slow", "store-network"),
)
SLOW_STORE_DELAY = 0.2  # seconds before each chunk to and from the store


@dataclass(frozen=True)
class Fault:
    at_s: float  # seconds after the load started
    kind: str
    target: str
    hold_s: float  # down (kill: until the restart) or paused (stop)


def schedule(
    seed: int, start_s: float, end_s: float, rounds: int, kinds: tuple[tuple[str, str], ...] = KINDS
) -> list[Fault]:
    """``rounds`` of every kind, shuffled per round, spread evenly over [start_s, end_s)."""
    rng = random.Random(seed)
    picked: list[tuple[str, str]] = []
    for _ in range(rounds):
        one = list(kinds)
        rng.shuffle(one)
        picked += one
    gap = (end_s - start_s) / max(1, len(picked))
    faults = []
    for i, (kind, target) in enumerate(picked):
        hold = rng.uniform(2.0, 6.0) if kind == "kill" else rng.uniform(8.0, 16.0)
        if kind in ("fill", "slow"):
            hold = rng.uniform(20.0, 40.0)
        hold = max(2.0, min(hold, 0.6 * gap))  # a fault ends before the next is due
        faults.append(Fault(round(start_s + i * gap, 1), kind, target, round(hold, 1)))
    return faults


def inject(
    stack: SoakStack,
    faults: list[Fault],
    started: float,
    stop: threading.Event,
    record: Callable[[dict[str, Any]], None],
    say: Callable[[str], None],
) -> None:
    """Each fault at its time (``started``: the load's ``time.time()``), one after
    another; a target's restart that fails is tried again until it comes back."""
    for fault in faults:
        if stop.wait(max(0.0, started + fault.at_s - time.time())):
            return
        at = time.time() - started
        say(f"fault at {at:.0f} s: {fault.kind} {fault.target} for {fault.hold_s:.0f} s")
        try:
            detail = _inject_one(stack, fault)
        except Exception as exc:  # a fault that could not be injected is said, not fatal
            detail = f"not injected: {type(exc).__name__}: {exc}"
        back = time.time() - started
        record(
            {**asdict(fault), "at_s": round(at, 1), "back_at_s": round(back, 1), "detail": detail}
        )


def _inject_one(stack: SoakStack, fault: Fault) -> str:
    """Inject ``fault``, hold it, undo it; what was done, in words."""
    if fault.kind == "kill":
        stack.kill(fault.target)
        time.sleep(fault.hold_s)
        detail = ""
        for attempt in range(5):
            try:
                stack.restart(fault.target)
                return "SIGKILL; restarted" + (f" (try {attempt + 1})" if attempt else "")
            except Exception as exc:  # a restart that fails is a finding: try again, say so
                detail = f"restart failed: {exc}"
                time.sleep(2.0)
        return detail
    if fault.kind == "stop":
        stack.pause(fault.target)
        time.sleep(fault.hold_s)
        stack.resume(fault.target)
        return "SIGSTOP, then SIGCONT"
    if fault.kind == "fill":
        try:
            filled = stack.fill_workspace(fault.target)
            time.sleep(fault.hold_s)
        finally:
            stack.free_workspace(fault.target)
        return "volume filled, then emptied" if filled else "not injected: no volume"
    stack.slow_store(SLOW_STORE_DELAY)
    try:
        time.sleep(fault.hold_s)
    finally:
        stack.slow_store(0.0)
    return f"{SLOW_STORE_DELAY * 1000:.0f} ms before each chunk, then none"
