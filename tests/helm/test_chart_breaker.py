"""The environment breaker's alert (tiergate.jobs.state.breaker) renders and reads the metric
the worker exports."""

from __future__ import annotations

from tests.helm.chart import VALUES, find, render
from tiergate.jobs.run.observe import WorkerMetrics


def test_breaker_alert_renders_and_reads_the_workers_metric() -> None:
    production = next(path for path in VALUES if path.name == "gpu-production.yaml")
    docs = render(production)
    rule = find(docs, "PrometheusRule", "rel-tiergate")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    alert = alerts["TiergateEnvironmentBreakerOpen"]
    assert "tiergate_environment_breaker_state" in alert["expr"]
    assert "by (environment)" in alert["expr"] and alert["for"] == "5m"
    assert "{{ $labels.environment }}" in alert["annotations"]["summary"]
    # The metric is one the worker's registry has.
    metrics = WorkerMetrics()
    metrics.breaker_state("default", "open")
    assert (
        metrics.registry.get_sample_value(
            "tiergate_environment_breaker_state", {"environment": "default"}
        )
        == 2.0
    )
