"""``tiergate bench urgency``: urgency and shared engines, measured through a gateway of
the benchmark's own in front of the running engines (the local stack's two by default).

Every round, in one run:

1. single engine: ``capacity`` streamed requests at once straight to the first engine, and
   shared: the same requests through the gateway's standard tier, which spreads them over
   every engine (the two in turns, the order alternating by round); aggregate output
   tokens/s of each, and how many requests each engine had in flight at the first token;
2. idle: one ``priority`` request alone through the gateway, then one ``flex`` request;
   their times to first token;
3. backlog: ``capacity`` standard requests through the gateway fill the standard tier's
   slots; once each has had its first token, one ``flex`` request is sent, and when the
   gateway's /metrics shows it queued, the other ``backlog - capacity`` standard requests
   (queued behind it in arrival order, ahead of it by urgency); when they are queued too,
   one ``priority`` request (the fast tier's gate, on the same engines). So a standard
   request without a first token when the priority one is sent is waiting in the gateway's
   queue, and a flex request that first-come order would admit first must yield. Every
   request's send and first-token times are kept on one clock;
   ``tiergate.bench.urgency.figures`` orders them.

Requests are greedy (temperature 0) over ``tiergate.speculative.measure.PROMPTS``.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tiergate.bench.urgency.figures import aggregate_tokens_per_s, backlog_figures, summarize
from tiergate.bench.urgency.gateway import (
    PATIENT_SECONDS,
    UrgencyBenchError,
    bench_settings,
    check_priority_scheduling,
    gateway_in_thread,
)
from tiergate.measure.fingerprint import hardware_fingerprint
from tiergate.measure.ports import free_ports
from tiergate.measure.stream import Sample, chat_body, timed
from tiergate.speculative.measure import PROMPTS
from tiergate.tiers import Tier

Progress = Callable[[str], None]
LOCAL_ENGINES = ("http://127.0.0.1:8101", "http://127.0.0.1:8102")
CHAT = "/v1/chat/completions"
# How long the backlog waits to see its requests in the gateway's queue before going on.
QUEUE_WAIT_SECONDS = 10.0


def _say(message: str) -> None:
    print(f"[bench urgency] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class UrgencyBenchParams:
    """What to measure; ``backlog`` None: twice ``capacity``."""

    engines: tuple[str, ...] = LOCAL_ENGINES
    model: str = "SmolLM2-135M-Instruct"
    capacity: int = 8
    backlog: int | None = None
    max_tokens: int = 96
    rounds: int = 3

    @property
    def backlog_requests(self) -> int:
        return 2 * self.capacity if self.backlog is None else self.backlog


@dataclass
class _Client:
    http: httpx.AsyncClient
    params: UrgencyBenchParams
    gateway: str
    engine: str
    firsts: int = 0
    events: list[tuple[int, asyncio.Event]] = field(default_factory=list)

    def body(self, i: int, tier: str | None) -> dict[str, Any]:
        p = self.params
        return chat_body(p.model, PROMPTS[i % len(PROMPTS)], p.max_tokens, tier)

    def after_firsts(self, count: int) -> asyncio.Event:
        """An event set once ``count`` more requests have had their first token."""
        event = asyncio.Event()
        self.events.append((self.firsts + count, event))
        return event

    def first_token(self) -> None:
        self.firsts += 1
        for count, event in self.events:
            if self.firsts >= count:
                event.set()

    def send(self, url: str, body: dict[str, Any]) -> asyncio.Task[Sample]:
        return asyncio.create_task(timed(self.http, url, body, self.first_token))


async def _batch(
    c: _Client, url: str, tier: str | None, scrape: bool
) -> tuple[float, dict[str, float]]:
    """``capacity`` requests at once: aggregate tokens/s, and (``scrape``) the gateway's
    requests in flight per standard-tier engine at the first token."""
    first = c.after_firsts(1) if scrape else None
    started = time.perf_counter()
    tasks = [c.send(url, c.body(i, tier)) for i in range(c.params.capacity)]
    spread: dict[str, float] = {}
    if first is not None:
        await _until(first, tasks)
        spread = await _in_flight(c.http, c.gateway)
    samples = await asyncio.gather(*tasks)
    return aggregate_tokens_per_s(samples, time.perf_counter() - started), spread


async def _gauge(http: httpx.AsyncClient, gateway: str, name: str) -> list[tuple[Any, float]]:
    """The gateway's ``name`` samples: (labels, value)."""
    text = (await http.get(f"{gateway}/metrics")).text
    return [
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        if family.name == name
        for sample in family.samples
    ]


async def _in_flight(http: httpx.AsyncClient, gateway: str) -> dict[str, float]:
    samples = await _gauge(http, gateway, "tiergate_endpoint_in_flight")
    return {labels["endpoint"]: value for labels, value in samples if labels["tier"] == "standard"}


async def _queued(c: _Client, depth: int, draining: Callable[[], bool]) -> bool:
    """Wait until the gateway's standard tier has ``depth`` requests in its admission
    queue; whether it did. Gives up after a few seconds, or once ``draining`` says a slot
    has been handed on (the queue will not grow any more)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + QUEUE_WAIT_SECONDS
    while loop.time() < deadline and not draining():
        samples = await _gauge(c.http, c.gateway, "tiergate_admission_queue_depth")
        if any(
            labels == {"tier": "standard", "lane": "all"} and value >= depth
            for labels, value in samples
        ):
            return True
        await asyncio.sleep(0.01)
    return False


async def _until(event: asyncio.Event, tasks: Sequence[asyncio.Task[Sample]]) -> None:
    """Wait for ``event``; a request that fails meanwhile raises its error here."""
    waiter = asyncio.create_task(event.wait())
    pending: set[asyncio.Future[Any]] = set(tasks)
    try:
        while not event.is_set() and pending:
            done, pending = await asyncio.wait(
                {waiter, *pending}, return_when=asyncio.FIRST_COMPLETED
            )
            pending.discard(waiter)
            for task in done:
                if task is not waiter:
                    task.result()
    finally:
        waiter.cancel()


async def _backlog(c: _Client, idle_priority_ttft: float) -> dict[str, Any]:
    """Fill the standard tier's slots and wait for their first tokens; then queue a flex
    request, then the rest of the standard requests behind it, then send a priority one."""
    p = c.params
    url = c.gateway + CHAT
    admitted = min(p.capacity, p.backlog_requests)
    filled = c.after_firsts(admitted)
    standard = [c.send(url, c.body(i, "default")) for i in range(admitted)]
    await _until(filled, standard)

    def draining() -> bool:
        return any(task.done() for task in standard)

    flex = c.send(url, c.body(1, "flex"))
    flex_queued_first = await _queued(c, 1, draining)
    standard += [c.send(url, c.body(i, "default")) for i in range(admitted, p.backlog_requests)]
    queued = await _queued(c, 1 + p.backlog_requests - admitted, draining)
    priority = c.send(url, c.body(0, "priority"))
    samples = list(await asyncio.gather(*standard))
    urgent, last = await priority, await flex
    figures = backlog_figures(
        samples, urgent, last, idle_priority_ttft, as_planned=flex_queued_first and queued
    )
    origin = min(s.started for s in samples)
    figures["samples"] = [
        _timeline(kind, s, origin)
        for kind, s in [("priority", urgent), ("flex", last)] + [("default", s) for s in samples]
    ]
    return figures


def _timeline(kind: str, s: Sample, origin: float) -> dict[str, Any]:
    first = None if s.first_token_at is None else round(s.first_token_at - origin, 4)
    return {
        "service_tier": kind,
        "sent_s": round(s.started - origin, 4),
        "first_token_s": first,
        "tokens": s.tokens,
    }


async def _round(c: _Client, index: int, progress: Progress) -> dict[str, Any]:
    p = c.params
    turns = [("single", c.engine + CHAT, None), ("shared", c.gateway + CHAT, "default")]
    speeds: dict[str, float] = {}
    spread: dict[str, float] = {}
    for name, url, tier in turns if index % 2 == 0 else turns[::-1]:
        speeds[name], seen = await _batch(c, url, tier, scrape=name == "shared")
        spread = seen or spread
    progress(
        f"round {index + 1}/{p.rounds}: {p.capacity} requests, one engine "
        f"{speeds['single']:.1f} tokens/s, through the gateway {speeds['shared']:.1f} tokens/s "
        f"(in flight per engine at the first token: {_spread_text(spread)})"
    )
    idle_priority = await timed(c.http, c.gateway + CHAT, c.body(0, "priority"))
    idle_flex = await timed(c.http, c.gateway + CHAT, c.body(1, "flex"))
    backlog = await _backlog(c, idle_priority.ttft)
    progress(
        f"round {index + 1}/{p.rounds}: idle TTFT priority {idle_priority.ttft * 1000:.0f} ms, "
        f"flex {idle_flex.ttft * 1000:.0f} ms; in a backlog of {p.backlog_requests}: priority "
        f"{backlog['priority_ttft_ms']:.0f} ms ({backlog['priority_ttft_vs_idle']:.2f}x idle), "
        f"{backlog['queued_standard_first_before_priority']} of "
        f"{backlog['queued_when_priority_sent']} queued standard requests first; "
        f"{backlog['standard_first_after_flex']} standard requests after the flex one"
    )
    return {
        "single_tokens_per_s": speeds["single"],
        "shared_tokens_per_s": speeds["shared"],
        "shared_vs_single": speeds["shared"] / max(1e-9, speeds["single"]),
        "shared_in_flight_per_engine": spread,
        "idle_priority_ttft_ms": idle_priority.ttft * 1000,
        "idle_flex_ttft_ms": idle_flex.ttft * 1000,
        "backlog": backlog,
    }


def _spread_text(spread: dict[str, float]) -> str:
    return ", ".join(f"{url} {n:g}" for url, n in spread.items()) or "unknown"


async def _rounds(gateway: str, params: UrgencyBenchParams, progress: Progress) -> list[Any]:
    timeout = httpx.Timeout(PATIENT_SECONDS, connect=10.0)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as http:
        c = _Client(http, params, gateway, params.engines[0].rstrip("/"))
        return [await _round(c, i, progress) for i in range(params.rounds)]


def bench_urgency(params: UrgencyBenchParams, progress: Progress = _say) -> dict[str, Any]:
    """Measure, and return the report's figures (``tiergate.bench.urgency.report`` renders
    them). Raises :class:`UrgencyBenchError` when it cannot measure."""
    if not params.engines or params.rounds < 1 or params.capacity < 1:
        raise UrgencyBenchError("need at least one engine, one round and a capacity of 1")
    engines = [e.rstrip("/") for e in params.engines]
    for engine in engines:
        check_priority_scheduling(engine, params.model)
    progress(f"engines {', '.join(engines)} schedule by priority (a priority: 1 was accepted)")
    settings = bench_settings(
        engines, params.capacity, params.backlog_requests + 2, free_ports()[0]
    )
    admission = settings.admission.tiers[Tier.STANDARD]
    progress(
        f"gateway on port {settings.gateway.port}: auth off, engine priorities on, every engine "
        f"in both tiers' pools, standard tier admits {admission.max_concurrent} at once "
        f"(queue {admission.max_queue}), queue timeout "
        f"{settings.admission.queue_timeout_seconds:g} s"
    )
    with gateway_in_thread(settings) as gateway:
        try:
            rounds = asyncio.run(_rounds(gateway, params, progress))
        except httpx.HTTPError as exc:
            raise UrgencyBenchError(f"a request of the benchmark failed: {exc!r}") from exc
    return {
        "hardware": hardware_fingerprint(settings.gpu_name),
        "engines": engines,
        "model": params.model,
        "capacity": params.capacity,
        "backlog": params.backlog_requests,
        "max_tokens": params.max_tokens,
        "rounds": params.rounds,
        "gateway": {
            "auth": False,
            "engine_priorities": settings.policy.engine_priorities,
            "standard_endpoints": settings.tiers[Tier.STANDARD].endpoints,
            "fast_endpoints": settings.tiers[Tier.FAST].endpoints,
            "standard_max_concurrent": admission.max_concurrent,
            "standard_max_queue": admission.max_queue,
            "queue_timeout_seconds": settings.admission.queue_timeout_seconds,
        },
        "per_round": rounds,
        "summary": summarize(rounds, len(params.engines)),
    }
