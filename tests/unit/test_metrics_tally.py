"""The hot path's metrics are tallied and added at scrape time: a scrape shows exactly what
prometheus_client's own inc()/observe() would have (the tally writes to its histogram
child's per-bucket values, which this pins against a prometheus_client upgrade)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tiergate.gateway.metrics import GatewayMetrics
from tiergate.tiers import Tier

VALUES = [0.0, 0.01, 0.02, 0.3, 2.5, 7.0, 100.0, 1000.0]


def _samples(text: bytes, name: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text.decode()):
        if family.name == name:
            for s in family.samples:
                if not s.name.endswith("_created"):
                    found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def test_a_scrape_shows_what_observe_would_have() -> None:
    metrics = GatewayMetrics({})
    reference_registry = CollectorRegistry()
    reference = Histogram(
        "tiergate_request_duration_seconds",
        "reference",
        ["tier"],
        buckets=metrics.latency._upper_bounds[:-1],
        registry=reference_registry,
    )
    for rounds in range(2):  # a second scrape adds only what came since the first
        for value in VALUES:
            metrics.observe(metrics.latency, value, Tier.STANDARD)
            reference.labels("standard").observe(value)
        ours = _samples(metrics.scrape(), "tiergate_request_duration_seconds")
        theirs = _samples(generate_latest(reference_registry), "tiergate_request_duration_seconds")
        assert ours == theirs, rounds
        count = ours[("tiergate_request_duration_seconds_count", (("tier", "standard"),))]
        assert count == len(VALUES) * (rounds + 1)


def test_counters_add_up_per_label_set() -> None:
    metrics = GatewayMetrics({})
    for _ in range(3):
        metrics.count(metrics.requests, Tier.FAST, "m", "/v1/chat/completions", "200")
    metrics.count(metrics.completion_tokens, Tier.FAST, "m", amount=42)
    metrics.count(metrics.completion_tokens, Tier.FAST, "m", amount=8)
    text = metrics.scrape()
    requests = _samples(text, "tiergate_requests")
    key = (
        "tiergate_requests_total",
        (
            ("model", "m"),
            ("path", "/v1/chat/completions"),
            ("status", "200"),
            ("tier", "fast"),
        ),
    )
    assert requests[key] == 3
    tokens = _samples(text, "tiergate_completion_tokens")
    assert tokens[("tiergate_completion_tokens_total", (("model", "m"), ("tier", "fast")))] == 50
    # Nothing new: the next scrape shows the same totals, not twice them.
    assert _samples(metrics.scrape(), "tiergate_requests")[key] == 3
