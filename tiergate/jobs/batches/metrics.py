"""Batch figures on the worker's ``/metrics``, counted by the worker that schedules the
batch as its rollouts end: rollouts by domain and outcome (a domain's pass rate is
``passed / all``; throughput is the counter's rate), queue wait (accepted to started) and
run time by domain. Domains are the tenants' own names: at most :data:`MAX_DOMAINS`
distinct ones get a label each in one process, the rest count as ``other``."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from tiergate.protocol import Job

MAX_DOMAINS = 100
_WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600)


class BatchMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self._domains: set[str] = set()
        self.rollouts_total = Counter(
            "tiergate_batch_rollouts_total",
            "Rollouts of batches that ended, by domain and outcome (passed, not_passed, error)",
            ["domain", "outcome"],
            registry=registry,
        )
        self.queue_wait_seconds = Histogram(
            "tiergate_batch_queue_wait_seconds",
            "A batch rollout's wait from accepted to started, by domain",
            ["domain"],
            buckets=_WAIT_BUCKETS,
            registry=registry,
        )
        self.rollout_seconds = Histogram(
            "tiergate_batch_rollout_seconds",
            "A batch rollout's run from started to ended, by domain",
            ["domain"],
            buckets=_WAIT_BUCKETS,
            registry=registry,
        )

    def _label(self, domain: str) -> str:
        if domain in self._domains:
            return domain
        if len(self._domains) < MAX_DOMAINS:
            self._domains.add(domain)
            return domain
        return "other"

    def ended(self, domain: str, job: Job) -> None:
        label = self._label(domain)
        if job.result is not None:
            outcome = "passed" if job.result.passed else "not_passed"
        else:
            outcome = "error"
        self.rollouts_total.labels(label, outcome).inc()
        if job.started_at is not None:
            self.queue_wait_seconds.labels(label).observe(max(0, job.started_at - job.created_at))
            if job.completed_at is not None:
                self.rollout_seconds.labels(label).observe(
                    max(0, job.completed_at - job.started_at)
                )
