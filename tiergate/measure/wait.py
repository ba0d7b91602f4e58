"""Waiting until something answers: the one polling loop of the package.

A server that exited, or any other failure seen while waiting, is the predicate's to
raise: the wait only decides when to look again and when to give up.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def _not_said(elapsed: float) -> None:
    pass


def wait_until(
    predicate: Callable[[], T],
    timeout: float | None,
    interval: float,
    *,
    waiting: Callable[[float], None] = _not_said,
) -> T | None:
    """Call ``predicate`` every ``interval`` seconds until it returns something true, and
    return that; ``None`` once ``timeout`` seconds have passed (``None``: no bound).

    The predicate is called at once, and the timeout is looked at only after a call, so a
    server that became ready during the last pause counts. ``waiting`` is told the seconds
    waited so far before each pause (progress lines belong there: never after giving up).
    """
    started = time.monotonic()
    while True:
        result = predicate()
        if result:
            return result
        elapsed = time.monotonic() - started
        if timeout is not None and elapsed >= timeout:
            return None
        waiting(elapsed)
        time.sleep(interval)
