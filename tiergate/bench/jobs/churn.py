"""The part of ``tiergate bench jobs`` that both modes share once the work is submitted:
every ``churn_seconds`` one worker is added or removed between 1 and ``max_workers`` (up
to the most, down to one, up again, as an autoscaler following a backlog would; removal
is SIGTERM, so the worker drains), and once half the work has ended the broker restarts
(same port and data), until all of it has ended or the deadline passes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from tiergate.bench.jobs.fleet import CONCURRENCY
from tiergate.bench.jobs.stack import JobsStack, say


class FleetPlan(Protocol):
    """How the fleet changes during a run (both modes' parameters have these)."""

    @property
    def max_workers(self) -> int: ...

    @property
    def churn_seconds(self) -> float: ...

    @property
    def broker_restart(self) -> bool: ...

    @property
    def deadline_seconds(self) -> float: ...


@dataclass
class ChurnRecord:
    """What the fleet did, in seconds after ``t0`` (the first submission)."""

    seconds: float  # to the end of the wait
    ended: int  # of the work's ``total``, at the end
    slots: list[tuple[float, int]]  # (seconds, slots serving from then on)
    fleet_changes: list[dict[str, Any]]
    broker_restart: dict[str, Any] | None


def churn(
    stack: JobsStack, plan: FleetPlan, t0: float, total: int, ended: Callable[[], int]
) -> ChurnRecord:
    """Churn the fleet (one worker serving at ``t0``, monotonic clock) and restart the
    broker once while ``ended()`` (read every second) is below ``total``."""
    fleet, server = stack.fleet, stack.broker
    assert fleet is not None and server is not None
    deadline = t0 + plan.deadline_seconds
    slots: list[tuple[float, int]] = [(0.0, len(fleet.serving) * CONCURRENCY)]
    changes: list[dict[str, Any]] = []
    restart: dict[str, Any] = {}
    restarting: threading.Thread | None = None
    direction, next_change, next_check = 1, t0 + plan.churn_seconds, 0.0
    done = 0

    def restart_broker() -> None:
        began = time.monotonic()
        server.restart()
        restart["took_s"] = round(time.monotonic() - began, 1)
        say(f"broker back in {restart['took_s']} s")

    while done < total and time.monotonic() < deadline:
        now = time.monotonic()
        fleet.reap()
        if now >= next_check:
            done = ended()
            next_check = now + 1.0
            if plan.broker_restart and restarting is None and done >= total / 2:
                say(f"{done}/{total} ended: restarting the broker")
                restart.update(at_s=round(now - t0, 1), ended_before=done)
                # In a thread, so that the fleet's clock and the polling go on meanwhile.
                restarting = threading.Thread(target=restart_broker, daemon=True)
                restarting.start()
        # A worker starting while the broker is away cannot make its topics: no change
        # until it is back (the change is due at once then).
        broker_away = restarting is not None and restarting.is_alive()
        if done < total and now >= next_change and not broker_away and plan.max_workers > 1:
            serving = len(fleet.serving)
            if not 1 <= serving + direction <= plan.max_workers:
                direction = -direction
            pid = fleet.add().proc.pid if direction > 0 else fleet.remove()
            count = len(fleet.serving)
            at = time.monotonic() - t0
            slots.append((at, count * CONCURRENCY))
            changes.append({"at_s": round(at, 1), "pid": pid, "workers": count})
            say(
                f"{'added' if direction > 0 else 'removed (SIGTERM)'} worker {pid}: "
                f"{count} serving; {done}/{total} ended"
            )
            next_change = time.monotonic() + plan.churn_seconds
        time.sleep(0.3)
    if restarting is not None:
        restarting.join(90)
    end = time.monotonic()
    if done < total:
        done = ended()
    say(
        f"{done}/{total} ended after {end - t0:.1f} s"
        + (f"; {total - done} without a terminal record at the deadline" if done < total else "")
    )
    return ChurnRecord(end - t0, done, slots, changes, restart or None)
