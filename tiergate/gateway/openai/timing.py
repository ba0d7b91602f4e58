"""An answer's time to first token (TTFT) and per output token (TPOT): in its access-log
line, in the gateway's histograms when it was streamed, and to its patient lane
(tiergate.gateway.access.patience), which sets how much patient work the engines take
from what interactive callers see.

A non-streamed chat or completions answer is read from the engine's stream (assembled:
tiergate.gateway.openai.assemble) and timed on that stream, so interactive callers who do
not stream steer the lane too. A stream whose writes waited for its client is not the
lane's signal: a client that reads slowly is slow by its own doing, and its TPOT would cut
the lane for every tenant's flex and batch work (or, taken as the reference, lift it).

An answer's TPOT is per choice: vLLM's ``completion_tokens`` sums the ``n`` choices it
decoded side by side in the same steps, so dividing by it would make a caller's ``n=8``
stream look 8x faster than the engine really was, and hold the lane open (or, as the
reference, shut it) for every tenant.
"""

from __future__ import annotations

from typing import Any

from tiergate.gateway.access.gatekeeper import Lease
from tiergate.gateway.metrics import GatewayMetrics
from tiergate.gateway.openai.streaming import StreamOutcome
from tiergate.tiers import Tier

# A stream whose writes waited for its client more than this share of its time is not the
# lane's signal (a write that did not wait takes microseconds: uvicorn's send returns at
# once unless the client's socket is full); a wait from CLIENT_WAIT_LOGGED is logged.
CLIENT_WAIT_SHARE = 0.05
CLIENT_WAIT_LOGGED = 0.001


def answer_times(
    metrics: GatewayMetrics,
    fields: dict[str, Any],
    lease: Lease,
    tier: Tier,
    timed: tuple[float, float, float],
    usage: dict[str, Any] | None,
    stream: StreamOutcome | None = None,
    choices: int = 1,
) -> None:
    """``timed``: when (``time.perf_counter``) the request came, its first token came and
    its answer ended; ``fields`` is the answer's log line; ``stream``: a streamed answer's
    outcome; ``choices``: the sequences decoded side by side (:func:`choices_of`)."""
    started, first_token_at, end = timed
    ttft = first_token_at - started
    fields["ttft_ms"] = round(ttft * 1000.0, 3)
    signal = True
    if stream is not None:
        metrics.observe(metrics.ttft, ttft, tier)
        waited = stream.client_wait_seconds
        if waited >= CLIENT_WAIT_LOGGED:
            fields["client_wait_ms"] = round(waited * 1000.0, 3)
        signal = stream.completed and waited <= CLIENT_WAIT_SHARE * (end - started)
    usage = usage or {}
    out_tokens = int(usage.get("completion_tokens", usage.get("output_tokens")) or 0)
    out_tokens //= max(1, choices)  # per choice: the n choices share each step
    if out_tokens > 1 and end > first_token_at:  # not all in one read: a time per token
        tpot = (end - first_token_at) / (out_tokens - 1)
        fields["tpot_ms"] = round(tpot * 1000.0, 3)
        if stream is not None:
            metrics.observe(metrics.tpot, tpot, tier)
        if signal:
            lease.observe_answer(tier, tpot, ttft)


def choices_of(body: dict[str, Any]) -> int:
    """How many sequences the engine decodes side by side for ``body``: its ``n`` (vLLM
    refuses a value that is not a positive integer, so anything else counts as 1)."""
    n = body.get("n")
    if isinstance(n, float) and n.is_integer():
        n = int(n)
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1
