"""The tests' one way to wait: poll a condition with a deadline, never sleep and hope."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from tiergate.measure.wait import wait_until

T = TypeVar("T")


def eventually(
    predicate: Callable[[], T],
    timeout: float = 30.0,
    interval: float = 0.05,
    what: str | Callable[[], str] = "the condition",
) -> T:
    """``predicate``'s first true value, polled every ``interval`` seconds; the test fails
    after ``timeout`` seconds naming ``what`` (a callable: its text at that moment)."""
    result = wait_until(predicate, timeout, interval)
    if not result:
        said = what() if callable(what) else what
        raise AssertionError(f"{said}: not so within {timeout:g} s")
    return result
