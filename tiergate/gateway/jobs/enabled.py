"""The one answer of every jobs-backed route on a gateway without jobs."""

from __future__ import annotations

from typing import TypeVar

from tiergate.gateway.errors import OpenAIError

T = TypeVar("T")


def enabled(part: T | None, why: str = "") -> T:
    """``part`` (a jobs-backed API), or 404 ``jobs_disabled`` when jobs are off; ``why``
    says what the route needs of the jobs."""
    if part is None:
        raise OpenAIError(
            404,
            f"{why}Jobs are not enabled on this gateway (jobs.enabled).",
            code="jobs_disabled",
        )
    return part
