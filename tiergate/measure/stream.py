"""Streamed chat completions timed per request: time to the first token (TTFT) and time
per output token (TPOT).

TPOT is (e2e - TTFT) / (output tokens - 1) per request: with speculation one streamed chunk
can carry several tokens, so gaps between chunks would mislead. The benchmark of both tiers
and the tuner's speed rounds take their samples here.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from tiergate.speculative.measure import PROMPTS


@dataclass
class Sample:
    ttft: float
    e2e: float
    tokens: int

    @property
    def tpot(self) -> float | None:
        return (self.e2e - self.ttft) / (self.tokens - 1) if self.tokens > 1 else None


async def _one(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> Sample:
    started = time.perf_counter()
    ttft = None
    tokens = 0
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
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
    return Sample(ttft or 0.0, time.perf_counter() - started, tokens)


async def run_level(
    url: str, model: str, tier: str | None, concurrency: int, requests: int, max_tokens: int
) -> tuple[list[Sample], float]:
    """``requests`` streamed chat completions, ``concurrency`` at a time."""
    semaphore = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=600) as client:

        async def bounded(i: int) -> Sample:
            body: dict[str, Any] = {
                "model": model,
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            }
            if tier:
                body["service_tier"] = tier
            async with semaphore:
                return await _one(client, url, body)

        started = time.perf_counter()
        samples = await asyncio.gather(*(bounded(i) for i in range(requests)))
        return list(samples), time.perf_counter() - started
