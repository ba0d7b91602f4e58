"""The gateway's Prometheus metrics, on a registry of the app's own (no global state).

With several worker processes (``tiergate serve --workers N``, ``PROMETHEUS_MULTIPROC_DIR``
set before prometheus_client is imported) the counters and histograms live in that
folder's files, and the registry scraped is a MultiProcessCollector over every process's
files plus this process's own collectors (read at scrape time); see
:mod:`tiergate.gateway.workers`.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from tiergate.backends.pool import TierPool
from tiergate.tiers import Tier

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)
_TPOT_BUCKETS = (0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0)
_OVERHEAD_BUCKETS = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
)


class _Tally:
    """One metric child's updates not yet added to it: a counter's amount, or a
    histogram's observations counted per bucket (the child's own bounds) and summed."""

    __slots__ = ("amount", "bounds", "child", "counts")

    def __init__(self, child: Any, bounds: list[float] | None) -> None:
        self.child = child
        self.bounds = bounds
        self.amount = 0.0
        self.counts = [0] * len(bounds) if bounds is not None else []

    def flush(self) -> None:
        if self.bounds is None:
            if self.amount:
                self.child.inc(self.amount)
        elif any(self.counts):
            # prometheus_client's histogram child keeps one value per bucket (made cumulative
            # when collected) and one for the sum; adding to them is what observe() does.
            self.child._sum.inc(self.amount)
            for index, count in enumerate(self.counts):
                if count:
                    self.child._buckets[index].inc(count)
            self.counts = [0] * len(self.counts)
        self.amount = 0.0


class _PoolCollector(Collector):
    """Endpoint health and in-flight requests, read from the pools at scrape time."""

    def __init__(self, pools: dict[Tier, TierPool]) -> None:
        self._pools = pools

    def collect(self):  # type: ignore[no-untyped-def]
        from prometheus_client.core import GaugeMetricFamily

        healthy = GaugeMetricFamily(
            "tiergate_endpoint_healthy",
            "1 when the endpoint is healthy and not ejected",
            labels=["tier", "endpoint"],
        )
        in_flight = GaugeMetricFamily(
            "tiergate_endpoint_in_flight",
            "Requests the gateway has outstanding on the endpoint",
            labels=["tier", "endpoint"],
        )
        for tier, pool in self._pools.items():
            for ep in pool.endpoints.values():
                healthy.add_metric([tier.value, ep.url], 1.0 if ep.available() else 0.0)
                in_flight.add_metric([tier.value, ep.url], float(ep.in_flight))
        yield healthy
        yield in_flight


class GatewayMetrics:
    """Every metric the gateway exports; created once per app."""

    def __init__(self, pools: dict[Tier, TierPool], multiprocess_dir: str | None = None) -> None:
        # ``registry`` is what /metrics serves and where collectors are registered; the
        # metrics themselves are registered there too, except with several processes,
        # where the MultiProcessCollector reads every process's values from the files.
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # ``multiprocess_dir``: settings' prometheus_multiproc_dir (one of several workers).
        self.multiprocess = bool(multiprocess_dir)
        if multiprocess_dir:
            r = CollectorRegistry(auto_describe=True)
            MultiProcessCollector(self.registry, multiprocess_dir)  # type: ignore[no-untyped-call]
        self.requests = Counter(
            "tiergate_requests_total",
            "Requests by served tier, model, endpoint path and status",
            ["tier", "model", "path", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "tiergate_request_duration_seconds",
            "End-to-end request latency",
            ["tier"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "tiergate_time_to_first_token_seconds",
            "Time to first token (streams)",
            ["tier"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "tiergate_time_per_output_token_seconds",
            "(e2e - TTFT) / (output tokens - 1), per streamed request",
            ["tier"],
            buckets=_TPOT_BUCKETS,
            registry=r,
        )
        self.overhead = Histogram(
            "tiergate_gateway_overhead_seconds",
            "Time spent in the gateway itself, upstream waiting excluded",
            ["stream"],
            buckets=_OVERHEAD_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "tiergate_prompt_tokens_total", "Input tokens", ["tier", "model"], registry=r
        )
        self.completion_tokens = Counter(
            "tiergate_completion_tokens_total", "Output tokens", ["tier", "model"], registry=r
        )
        # Per owner (a configured key's team, or the key itself: bounded by the keys), what
        # its budgets count (tiergate.gateway.access.budgets): prompt plus completion.
        self.usage_tokens = Counter(
            "tiergate_usage_tokens_total",
            "Tokens used (prompt plus completion, as the engine reported), per owner and tier",
            ["owner", "tier"],
            registry=r,
        )
        self.retries = Counter(
            "tiergate_retries_total",
            "Upstream attempts retried on another endpoint",
            ["tier", "reason"],
            registry=r,
        )
        self.fallbacks = Counter(
            "tiergate_fallbacks_total",
            "Requests moved to the other tier",
            ["from_tier", "to_tier", "reason"],
            registry=r,
        )
        self.stream_errors = Counter(
            "tiergate_stream_errors_total",
            "Streams that broke after the first byte (client got an error event)",
            ["tier", "reason"],
            registry=r,
        )
        self.ejections = Counter(
            "tiergate_endpoint_ejections_total",
            "Passive ejections after consecutive failures",
            ["tier"],
            registry=r,
        )
        self.client_disconnects = Counter(
            "tiergate_client_disconnects_total",
            "Requests whose client went away; the upstream request was cancelled",
            ["tier"],
            registry=r,
        )
        self.rate_limited = Counter(
            "tiergate_rate_limited_total",
            "Requests refused for a key's own limit (429)",
            ["key", "reason"],
            registry=r,
        )
        self.admission_rejected = Counter(
            "tiergate_admission_rejected_total",
            "Requests refused because a tier's admission queue was full or too slow (503)",
            ["tier"],
            registry=r,
        )
        self.queue_wait = Histogram(
            "tiergate_admission_wait_seconds",
            "Time spent in a tier's admission queue",
            ["tier"],
            buckets=(*_OVERHEAD_BUCKETS, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.up = Gauge(
            "tiergate_up", "1 while the gateway runs", registry=r, multiprocess_mode="max"
        )
        self.up.set(1)
        self.registry.register(_PoolCollector(pools))
        self._tallies: dict[tuple[Any, ...], _Tally] = {}

    # -- the hot path -----------------------------------------------------------------------
    # What every proxied request counts (requests, tokens, latency, overhead, admission
    # wait) is tallied in plain numbers and added to the Prometheus metrics when they are
    # scraped (:meth:`scrape`): prometheus_client locks and validates on each update, about
    # 4% of a proxied request's CPU for its six updates. With several processes, whose
    # scrape is answered from the others' files, each update is added at once.

    def count(self, metric: Counter, *labels: str, amount: float = 1.0) -> None:
        """``metric.labels(*labels).inc(amount)``; the label values must come from a bounded
        set (as every label here does)."""
        tally = self._tallies.get((metric, *labels))
        if tally is None:
            tally = self._tally(metric, labels, None)
        tally.amount += amount
        if self.multiprocess:
            tally.flush()

    def observe(self, metric: Histogram, value: float, *labels: str) -> None:
        """``metric.labels(*labels).observe(value)``, as :meth:`count`."""
        tally = self._tallies.get((metric, *labels))
        if tally is None:
            tally = self._tally(metric, labels, list(metric._upper_bounds))
        tally.amount += value
        tally.counts[bisect_left(tally.bounds, value)] += 1  # type: ignore[arg-type]
        if self.multiprocess:
            tally.flush()

    def _tally(self, metric: Any, labels: tuple[str, ...], bounds: list[float] | None) -> _Tally:
        tally = self._tallies[(metric, *labels)] = _Tally(metric.labels(*labels), bounds)
        return tally

    def flush(self) -> None:
        """Add what was tallied to the Prometheus metrics."""
        for tally in self._tallies.values():
            tally.flush()

    def scrape(self) -> bytes:
        """The exposition text of every metric, tallies included."""
        self.flush()
        return generate_latest(self.registry)
