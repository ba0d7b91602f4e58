"""``tiergate bench fairness``: two tenants of the same priority and limits share one
engine through a gateway of the benchmark's own, with keys (issue 52).

Tenant A keeps ``flood`` streamed requests going (its whole ``max_concurrent``); tenant B
sends ``samples`` requests one after another. In one run, each through a fresh gateway on
the same engine:

1. **first come, first served** (flow control and fairness off, the gateway as it was):
   B alone, then B while A floods;
2. **fair** (the defaults: flow control, token-weighted fairness, the reserve): B alone,
   B while A floods, then both flooding for ``share_seconds``: each tenant's share of the
   weighted tokens (prompt 1, output 2, as the gateway counts them) of the requests that
   ended in the window, against its weight's share.

B's medians of time to first token and per output token are compared with B alone in the
same gateway. Every half second the gateway's tier limit and the engine's running and
waiting requests are sampled for the report's figure. The gateway and each flood run in a
process of their own (tiergate.bench.fairness.procs), apart from B's client.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tiergate.bench.fairness.procs import Flood, Gauges, gateway_in_process
from tiergate.bench.urgency.gateway import UrgencyBenchError
from tiergate.gateway.access.auth import new_key
from tiergate.measure.ports import free_ports
from tiergate.measure.stream import Sample, chat_body, timed
from tiergate.settings import Settings, load_settings
from tiergate.speculative.measure import PROMPTS

CHAT = "/v1/chat/completions"
PATIENT = 600.0
# How long B waits, at most, for the gateway to meet A's flood before it is measured.
SETTLE_SECONDS = 60.0
STEADY_SECONDS = 5.0
# How often the figure's gauges are read (tiergate.bench.fairness.procs.Gauges): vLLM's
# /metrics costs its API server the CPU that B's requests wait for, so not too often.
GAUGE_SECONDS = 1.0


def _say(message: str) -> None:
    print(f"[bench fairness] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class FairnessParams:
    engine: str = "http://127.0.0.1:8101"
    model: str = "SmolLM2-135M-Instruct"
    flood: int = 16
    samples: int = 8
    max_tokens: int = 64
    share_seconds: float = 60.0
    weight_a: float = 1.0
    weight_b: float = 1.0


@dataclass
class Phase:
    """One phase's B samples (and A's, where A flooded), the sampled gauges, and the
    window (perf_counter) B's requests were sent in."""

    name: str
    b: list[Sample] = field(default_factory=list)
    a: list[Sample] = field(default_factory=list)
    gauges: list[tuple[float, float, float, float]] = field(default_factory=list)
    window: tuple[float, float] = (0.0, 0.0)
    settle_seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        start, end = self.window
        ended = [s for s in self.a + self.b if start <= s.started + s.e2e <= end]
        seconds = end - start
        return {
            "b_requests": len(self.b),
            "b_ttft_ms": _median_ms([s.ttft for s in self.b]),
            "b_ttft_ms_each": [round(s.ttft * 1000) for s in self.b][:32],
            "b_tpot_ms": _median_ms([s.tpot for s in self.b if s.tpot is not None]),
            "a_requests": len(self.a),
            # Both tenants' output tokens of the requests that ended while B was sending.
            "output_tokens_per_s": round(sum(s.tokens for s in ended) / seconds, 1)
            if seconds > 0
            else None,
            "settle_seconds": round(self.settle_seconds, 1),
        }


def _median_ms(values: list[float]) -> float | None:
    return round(statistics.median(values) * 1000, 1) if values else None


def gateway_settings(
    params: FairnessParams, fair: bool, port: int
) -> tuple[Settings, dict[str, str]]:
    """The bench gateway's settings (keys a and b, ``flood`` concurrent each, the same
    priority) and the two keys. ``fair`` False: flow control, fairness and the reserve off."""
    (key_a, hash_a), (key_b, hash_b) = new_key(), new_key()
    limits = {"max_concurrent": params.flood}
    admission: dict[str, Any] = {"queue_timeout_seconds": PATIENT}
    if not fair:
        admission |= {
            "flow": {"adaptive": False, "reserve": 0, "linger_seconds": 0},
            "fair_share": {"enabled": False},
        }
    tree: dict[str, Any] = {
        "gateway": {
            "host": "127.0.0.1",
            "port": port,
            "log_requests": False,
            "metrics_port": None,
            "metrics_on_serving_port": True,
            "tier_evidence_file": None,
        },
        "tiers": {"standard": {"endpoints": [params.engine]}, "fast": {"endpoints": []}},
        "auth": {
            "enabled": True,
            "keys": [
                {"name": "a", "hash": hash_a, "limits": limits, "weight": params.weight_a},
                {"name": "b", "hash": hash_b, "limits": limits, "weight": params.weight_b},
            ],
        },
        "jobs": {"enabled": False},
        "admission": admission,
        "timeouts": {
            "first_byte_seconds": PATIENT,
            "between_chunks_seconds": PATIENT,
            "client_write_seconds": PATIENT,
        },
    }
    return load_settings(**tree), {"a": key_a, "b": key_b}


async def read_gauges(base: str, engine: str) -> tuple[float, float, float]:
    """The gateway's standard tier limit, and the engine's running and waiting requests."""
    async with httpx.AsyncClient(timeout=5) as client:
        gateway = (await client.get(f"{base}/metrics")).text
        served = (await client.get(f"{engine}/metrics")).text
    limit = _metric(gateway, "tiergate_admission_limit", {"tier": "standard"})
    running = _metric(served, "vllm:num_requests_running", {})
    waiting = _metric(served, "vllm:num_requests_waiting", {})
    return limit, running, waiting


def _metric(text: str, name: str, labels: dict[str, str]) -> float:
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


class _Run:
    """One gateway's phases: B's client, and the floods and gauges in processes of their own."""

    def __init__(self, params: FairnessParams, base: str, keys: dict[str, str]) -> None:
        self.params = params
        self.url = f"{base}{CHAT}"
        self.base = base
        self.keys = keys
        self.t0 = time.perf_counter()

    def client(self, tenant: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            timeout=PATIENT,
            headers={"authorization": f"Bearer {self.keys[tenant]}"},
            limits=httpx.Limits(max_connections=self.params.flood + 4),
        )

    def body(self, i: int) -> dict[str, Any]:
        return chat_body(self.params.model, PROMPTS[i % len(PROMPTS)], self.params.max_tokens, None)

    async def one_at_a_time(self, tenant: str, count: int, into: list[Sample]) -> None:
        async with self.client(tenant) as client:
            for i in range(count):
                into.append(await timed(client, self.url, self.body(i)))

    async def flood(
        self, tenant: str, into: list[Sample], stop: asyncio.Event, started: asyncio.Event
    ) -> None:
        """``flood`` streams of ``tenant`` one after another until ``stop``; ``started``
        is set once each has had a first token."""
        firsts = 0

        def first() -> None:
            nonlocal firsts
            firsts += 1
            if firsts >= self.params.flood:
                started.set()

        async with self.client(tenant) as client:

            async def loop(n: int) -> None:
                i = n
                while not stop.is_set():
                    into.append(await timed(client, self.url, self.body(i), first))
                    i += self.params.flood

            await asyncio.gather(*(loop(n) for n in range(self.params.flood)))

    async def alone(self) -> Phase:
        phase = Phase("B alone")
        gauges = Gauges(self.base, self.params.engine, self.t0, GAUGE_SECONDS)
        await self.one_at_a_time("b", 2, [])  # warm-up, and the flow reference
        start = time.perf_counter()
        await self.one_at_a_time("b", self.params.samples, phase.b)
        phase.window = (start, time.perf_counter())
        phase.gauges = await gauges.stop()
        return phase

    async def _settled(self) -> bool:
        """Whether flow control has met the flood: the standard tier's limit is under the
        flood and no more than it hold the tier's slots."""
        async with httpx.AsyncClient(timeout=5) as client:
            text = (await client.get(f"{self.base}/metrics")).text
        limit = _metric(text, "tiergate_admission_limit", {"tier": "standard"})
        held = _metric(text, "tiergate_admission_in_flight", {"tier": "standard", "lane": "all"})
        return limit < self.params.flood and held <= limit

    async def beside_flood(self, fair: bool) -> Phase:
        phase = Phase("B while A floods")
        gauges = Gauges(self.base, self.params.engine, self.t0, GAUGE_SECONDS)
        flood = Flood(self.params, self.base, self.keys, "a")
        await flood.started(PATIENT)
        # B is measured once the gateway has met the flood (a steady flood, not its first
        # seconds): the tier's limit has come down to what the engine takes.
        # Settled: held under the limit, itself under the flood, for STEADY_SECONDS on end
        # (flow control's first cuts take a few seconds to drain: measured from the first
        # one, B's first requests met a flood still above what the engine takes).
        settle = time.perf_counter()
        await asyncio.sleep(2.0)
        steady_since: float | None = None
        while fair and time.perf_counter() - settle < SETTLE_SECONDS:
            now = time.perf_counter()
            if not await self._settled():
                steady_since = None
            elif steady_since is None:
                steady_since = now
            elif now - steady_since >= STEADY_SECONDS:
                break
            await asyncio.sleep(0.5)
        phase.settle_seconds = time.perf_counter() - settle
        start = time.perf_counter()
        await self.one_at_a_time("b", self.params.samples, phase.b)
        phase.window = (start, time.perf_counter())
        phase.a = await flood.stop()
        phase.gauges = await gauges.stop()
        return phase

    async def both_saturate(self, progress: Callable[[str], None]) -> tuple[Phase, dict[str, Any]]:
        phase = Phase("both flood")
        gauges = Gauges(self.base, self.params.engine, self.t0, GAUGE_SECONDS)
        floods = [Flood(self.params, self.base, self.keys, tenant) for tenant in ("a", "b")]
        await asyncio.sleep(5.0)  # past the first requests of both
        window_start = time.perf_counter()
        seconds = self.params.share_seconds
        while time.perf_counter() - window_start < seconds:
            left = seconds - (time.perf_counter() - window_start)
            progress(f"both flooding: {left:.0f}s left")
            await asyncio.sleep(min(10.0, max(0.0, left)))
        window_end = time.perf_counter()
        phase.window = (window_start, window_end)
        phase.a, phase.b = [await flood.stop() for flood in floods]
        phase.gauges = await gauges.stop()
        return phase, _shares(phase, window_start, window_end, self.params)


def _shares(phase: Phase, start: float, end: float, params: FairnessParams) -> dict[str, Any]:
    """Each tenant's weighted tokens (prompt 1, output 2) of the requests that ended in
    ``[start, end]``, its share and its weight's share."""

    def tokens(samples: list[Sample]) -> tuple[int, float]:
        ended = [s for s in samples if start <= s.started + s.e2e <= end]
        return len(ended), sum(s.prompt_tokens + 2 * s.tokens for s in ended)

    (n_a, t_a), (n_b, t_b) = tokens(phase.a), tokens(phase.b)
    total = t_a + t_b or 1.0
    weights = params.weight_a + params.weight_b
    return {
        "window_seconds": round(end - start, 1),
        "a": {
            "requests": n_a,
            "tokens": t_a,
            "share": round(t_a / total, 3),
            "weight_share": round(params.weight_a / weights, 3),
        },
        "b": {
            "requests": n_b,
            "tokens": t_b,
            "share": round(t_b / total, 3),
            "weight_share": round(params.weight_b / weights, 3),
        },
    }


async def _one_gateway(params: FairnessParams, fair: bool) -> dict[str, Any]:
    label = "fair" if fair else "first come, first served"
    settings, keys = gateway_settings(params, fair, free_ports(1)[0])
    with gateway_in_process(settings, keys["b"]) as base:
        run = _Run(params, base, keys)
        _say(f"{label}: B alone, {params.samples} requests")
        alone = await run.alone()
        _say(f"{label}: B while A keeps {params.flood} streams going")
        flood = await run.beside_flood(fair)
    phases = [alone, flood]
    shares = None
    if fair:
        # A gateway of its own: the shares start from no history (the flood before would
        # put B first for a window while it caught up with A's count).
        settings, keys = gateway_settings(params, fair, free_ports(1)[0])
        with gateway_in_process(settings, keys["b"]) as base:
            run = _Run(params, base, keys)
            await run.one_at_a_time("b", 3, [])  # flow control's reference, as in the others
            both, shares = await run.both_saturate(lambda m: _say(f"{label}: {m}"))
        phases.append(both)
    return {
        "gateway": label,
        "phases": {p.name: p.summary() for p in phases},
        "gauges": {p.name: p.gauges for p in phases},
        "shares": shares,
        "b_slowdown": _slowdown(alone, flood),
    }


def _slowdown(alone: Phase, flood: Phase) -> dict[str, float | None]:
    a, f = alone.summary(), flood.summary()
    return {
        kind: round(f[kind] / a[kind], 2) if a[kind] and f[kind] else None
        for kind in ("b_ttft_ms", "b_tpot_ms")
    }


def check_engine(params: FairnessParams) -> None:
    body = {"model": params.model, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    try:
        resp = httpx.post(f"{params.engine}{CHAT}", json=body, timeout=120)
    except httpx.HTTPError as exc:
        raise UrgencyBenchError(
            f"engine {params.engine} does not answer ({exc}); is it running?"
        ) from None
    if resp.status_code != 200:
        raise UrgencyBenchError(
            f"engine {params.engine} answered {resp.status_code}: {resp.text.strip()[:200]}"
        )


def bench_fairness(params: FairnessParams) -> dict[str, Any]:
    from tiergate.measure.fingerprint import hardware_fingerprint

    check_engine(params)
    started = time.perf_counter()
    runs = [asyncio.run(_one_gateway(params, fair)) for fair in (False, True)]
    return {
        "params": asdict(params),
        "hardware": hardware_fingerprint(load_settings().gpu_name),
        "seconds": round(time.perf_counter() - started, 1),
        "runs": runs,
    }
