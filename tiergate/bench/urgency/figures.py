"""The urgency benchmark's figures, computed from its samples (no I/O here).

Per round: the aggregate output speed of one engine and of the gateway's shared pool, the
idle time to first token of a ``priority`` and of a ``flex`` request, and what happened in
the backlog: the ``priority`` request's TTFT, how many queued standard requests got their
first token before it did, and how many standard requests got theirs after the ``flex``
one did. Over the rounds: medians, and each target met or not (reported, never asserted).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from tiergate.measure.stream import Sample

SHARED_SPEEDUP_TARGET = 1.5
PRIORITY_TTFT_TARGET = 1.5


def aggregate_tokens_per_s(samples: Sequence[Sample], wall: float) -> float:
    """Output tokens of all the requests over the wall time they took together."""
    return sum(s.tokens for s in samples) / max(1e-9, wall)


def backlog_figures(
    standard: Sequence[Sample],
    priority: Sample,
    flex: Sample,
    idle_priority_ttft: float,
    as_planned: bool = True,
) -> dict[str, Any]:
    """What one backlog round shows. A standard request counts as queued when it had no
    first token yet at the moment the ``priority`` request was sent; one that never had a
    first token is counted apart (``standard_without_first_token``), not ordered.
    ``as_planned``: the flex request and then every other standard request were seen
    waiting in the gateway's queue before the priority request was sent (else a slot came
    free first, and the round's order says less)."""
    answered = [s for s in standard if s.first_token_at is not None]
    queued = [s for s in answered if _first(s) > priority.started]
    p_first, f_first = priority.first_token_at, flex.first_token_at
    return {
        "as_planned": as_planned,
        "standard_requests": len(standard),
        "standard_without_first_token": len(standard) - len(answered),
        "queued_when_priority_sent": len(queued),
        "priority_ttft_ms": priority.ttft * 1000,
        "priority_ttft_vs_idle": priority.ttft / max(1e-9, idle_priority_ttft),
        "queued_standard_first_before_priority": (
            len(queued) if p_first is None else sum(_first(s) < p_first for s in queued)
        ),
        "flex_ttft_ms": flex.ttft * 1000,
        "standard_first_after_flex": (
            len(answered) if f_first is None else sum(_first(s) > f_first for s in answered)
        ),
        # Above 0: the flex request's first token came this long after the last standard
        # one's; near 0 the two were admitted together (slots freed in the same moment).
        "flex_first_after_last_standard_ms": (
            None
            if f_first is None or not answered
            else (f_first - max(_first(s) for s in answered)) * 1000
        ),
        "priority_answered": p_first is not None,
        "flex_answered": f_first is not None,
    }


def _first(sample: Sample) -> float:
    assert sample.first_token_at is not None
    return sample.first_token_at


def _median(rounds: Sequence[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in rounds))


def summarize(rounds: Sequence[dict[str, Any]], engines: int = 2) -> dict[str, Any]:
    """Medians over the rounds and the three targets. Each round is a dict with
    ``single_tokens_per_s``, ``shared_tokens_per_s``, ``idle_priority_ttft_ms``,
    ``idle_flex_ttft_ms`` and ``backlog`` (from :func:`backlog_figures`)."""
    if not rounds:
        raise ValueError("no rounds")
    backlogs = [r["backlog"] for r in rounds]
    single = _median(rounds, "single_tokens_per_s")
    shared = _median(rounds, "shared_tokens_per_s")
    idle = _median(rounds, "idle_priority_ttft_ms")
    in_backlog = _median(backlogs, "priority_ttft_ms")
    overtaken = max(b["queued_standard_first_before_priority"] for b in backlogs)
    after_flex = max(b["standard_first_after_flex"] for b in backlogs)
    unanswered = any(not (b["priority_answered"] and b["flex_answered"]) for b in backlogs)
    speedup = shared / max(1e-9, single)
    ttft_ratio = in_backlog / max(1e-9, idle)
    return {
        "single_tokens_per_s": single,
        "shared_tokens_per_s": shared,
        "shared_vs_single": speedup,
        "idle_priority_ttft_ms": idle,
        "idle_flex_ttft_ms": _median(rounds, "idle_flex_ttft_ms"),
        "backlog_priority_ttft_ms": in_backlog,
        "backlog_priority_ttft_vs_idle": ttft_ratio,
        "backlog_flex_ttft_ms": _median(backlogs, "flex_ttft_ms"),
        "most_queued_standard_first_before_priority": overtaken,
        "most_standard_first_after_flex": after_flex,
        "rounds_as_planned": sum(bool(b["as_planned"]) for b in backlogs),
        "targets": {
            # With one engine (the local stack's measured layout where a second engine adds
            # nothing) there is nothing to share: the ratio is then the gateway's cost.
            "shared_engines": {
                "target": f"shared/single aggregate tokens/s >= {SHARED_SPEEDUP_TARGET}"
                if engines > 1
                else "not applicable: one engine (the figure is the gateway against direct)",
                "value": speedup,
                "met": speedup >= SHARED_SPEEDUP_TARGET if engines > 1 else None,
            },
            "priority_first": {
                "target": f"priority TTFT in the backlog <= {PRIORITY_TTFT_TARGET}x idle, "
                "and no queued standard request first (every round)",
                "value": ttft_ratio,
                "met": ttft_ratio <= PRIORITY_TTFT_TARGET and overtaken == 0 and not unanswered,
            },
            "flex_last": {
                "target": "no standard request's first token after the flex one's (every round)",
                "value": after_flex,
                "met": after_flex == 0 and not unanswered,
            },
        },
    }
