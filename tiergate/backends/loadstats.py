"""Load signals from vLLM's Prometheus ``/metrics`` text."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tiergate.backends.endpoint import LoadSignals

_GAUGES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "vllm:gpu_cache_usage_perc": "kv_cache_usage",  # name before vLLM 0.10
}
_PREFIXES = tuple(_GAUGES)


def parse_load_signals(text: str) -> LoadSignals:
    """Sum the load gauges over every model an engine serves.

    vLLM's exposition is mostly histograms (tens of kB); only the few gauge lines we read are
    handed to the Prometheus parser, which keeps a scrape cheap on the gateway's core.
    """
    wanted = "\n".join(line for line in text.splitlines() if line.startswith(_PREFIXES))
    signals = LoadSignals()
    for family in text_string_to_metric_families(wanted + "\n"):
        for sample in family.samples:
            attr = _GAUGES.get(sample.name)
            if attr is not None:
                setattr(signals, attr, getattr(signals, attr) + sample.value)
    return signals
