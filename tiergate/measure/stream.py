"""Streamed chat completions timed per request: time to the first token (TTFT) and time
per output token (TPOT).

TPOT is (e2e - TTFT) / (output tokens - 1) per request: with speculation one streamed chunk
can carry several tokens, so gaps between chunks would mislead. The benchmark of both tiers,
the urgency benchmark and the tuner's speed rounds take their samples here. Every sample
also keeps when it was sent and when its first token came, on ``time.perf_counter``'s clock,
so that requests sent side by side can be put in order.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from tiergate.speculative.measure import PROMPTS


@dataclass
class Sample:
    """One streamed request: seconds to its first content token (0 if none came) and to
    its end, its output tokens (the usage chunk's), and, on ``time.perf_counter``'s clock,
    when it was sent and when its first content token came (None if none did)."""

    ttft: float
    e2e: float
    tokens: int
    started: float = 0.0
    first_token_at: float | None = None
    prompt_tokens: int = 0

    @property
    def tpot(self) -> float | None:
        return (self.e2e - self.ttft) / (self.tokens - 1) if self.tokens > 1 else None


def chat_body(model: str, prompt: str, max_tokens: int, tier: str | None) -> dict[str, Any]:
    """A greedy streamed chat completion that reports its usage; ``tier``: its
    ``service_tier`` (None: none named)."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": prompt}],
    }
    if tier:
        body["service_tier"] = tier
    return body


async def timed(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    on_first_token: Callable[[], None] | None = None,
) -> Sample:
    """Send one streamed completion and time it; ``on_first_token`` is called when its
    first content token arrives."""
    started = time.perf_counter()
    ttft = None
    tokens = prompt_tokens = 0
    async with client.stream("POST", url, json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and ttft is None:
                delta = chunk["choices"][0].get("delta", {})
                if delta.get("content"):
                    ttft = time.perf_counter() - started
                    if on_first_token is not None:
                        on_first_token()
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
                prompt_tokens = int(chunk["usage"].get("prompt_tokens") or 0)
    first = None if ttft is None else started + ttft
    e2e = time.perf_counter() - started
    return Sample(ttft or 0.0, e2e, tokens, started, first, prompt_tokens)


async def run_level(
    url: str,
    model: str,
    tier: str | None,
    concurrency: int,
    requests: int,
    max_tokens: int,
    prompts: Sequence[str] = PROMPTS,
) -> tuple[list[Sample], float]:
    """``requests`` streamed chat completions, ``concurrency`` at a time, over ``prompts``
    in turn."""
    semaphore = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=600) as client:

        async def bounded(i: int) -> Sample:
            body = chat_body(model, prompts[i % len(prompts)], max_tokens, tier)
            async with semaphore:
                return await timed(client, url, body)

        started = time.perf_counter()
        samples = await asyncio.gather(*(bounded(i) for i in range(requests)))
        return list(samples), time.perf_counter() - started
