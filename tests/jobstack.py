"""A gateway with jobs enabled, and workers started on demand, for tests."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from kafka import KafkaConsumer

from tests.servers import free_port, gateway_settings, running_gateway
from tests.waiting import eventually
from tiergate.jobs.run.worker import Worker
from tiergate.jobs.state.store import JobStore
from tiergate.jobsettings import JobsSettings
from tiergate.queue.pipeline import JobQueue
from tiergate.settings import Settings


def jobs_tree(
    broker: str, s3: str, gateway_url: str, tmp_path: Path, **worker: Any
) -> dict[str, Any]:
    name = uuid.uuid4().hex[:10]
    return {
        "enabled": True,
        "gateway_url": gateway_url,
        "kafka": {
            "bootstrap_servers": broker,
            "topic": f"jobs-{name}",
            "retry_topic": f"retry-{name}",
            "dead_letter_topic": f"dead-{name}",
            "group": f"workers-{name}",
            "batch_topic": f"openai-batches-{name}",
            "batch_group": f"batch-workers-{name}",
            "partitions": 2,
        },
        "storage": {"endpoint_url": s3, "bucket": f"bucket-{name}"},
        # Not under pytest's tmp_path: its parents are private to root, and the sandbox's
        # unprivileged user must reach the workspace.
        "sandbox": {"work_dir": f"/tmp/tiergate-sandboxes/{name}"},
        "worker": {
            "concurrency": 1,
            "drain_seconds": 5,
            "retry_backoff_seconds": 0.5,
            "cancel_poll_seconds": 0.3,
            **worker,
        },
    }


class JobsStack:
    """A gateway with jobs on, and workers started on demand."""

    def __init__(self, base: str, settings: Settings) -> None:
        self.base = base
        self.settings = settings
        self.workers: list[Worker] = []

    @property
    def jobs(self) -> JobsSettings:
        return self.settings.jobs

    def worker_settings(self, **overrides: Any) -> JobsSettings:
        """A copy of the stack's jobs settings with ``overrides`` of ``jobs.worker``."""
        jobs = self.jobs.model_copy(deep=True)
        for key, value in overrides.items():
            setattr(jobs.worker, key, value)
        return jobs

    def start_worker(
        self, jobs: JobsSettings | None = None, *, serve_http: bool = False, **overrides: Any
    ) -> Worker:
        """A started worker on ``jobs`` (default: :meth:`worker_settings` of ``overrides``);
        with ``serve_http``, its /metrics and /healthz on a free loopback port."""
        jobs = jobs or self.worker_settings(**overrides)
        if serve_http:
            jobs.worker.metrics_port, jobs.worker.metrics_host = free_port(), "127.0.0.1"
        worker = Worker(jobs, serve_http=serve_http)
        worker.start()
        self.workers.append(worker)
        return worker

    def submit(self, body: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
        resp = httpx.post(f"{self.base}/v1/jobs", json=body, headers=headers or {})
        assert resp.status_code == 200, resp.text
        job: dict[str, Any] = resp.json()
        return job

    def wait(
        self,
        job_id: str,
        until: Callable[[dict[str, Any]], bool],
        timeout: float = 60,
        headers: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        seen: list[dict[str, Any]] = []

        def reached() -> dict[str, Any] | None:
            job: dict[str, Any] = httpx.get(
                f"{self.base}/v1/jobs/{job_id}", headers=headers or {}
            ).json()
            seen[:] = [job]
            return job if until(job) else None

        return eventually(reached, timeout, 0.2, lambda: f"job reached the state: {seen}")


@contextmanager
def jobs_stack(
    broker: str, s3: str, model: Any, tmp_path: Path, ensure: bool = True, **overrides: Any
) -> Iterator[JobsStack]:
    """``model`` is anything with a ``url`` (FakeVllm), or a (standard, fast) pair of URLs."""
    port = free_port()
    worker = overrides.pop("worker", {})
    tree = jobs_tree(broker, s3, f"http://127.0.0.1:{port}", tmp_path, **worker)
    for key, value in overrides.pop("jobs", {}).items():
        if isinstance(value, dict) and isinstance(tree.get(key), dict):
            tree[key] = {**tree[key], **value}
        else:
            tree[key] = value
    standard, fast = model if isinstance(model, tuple) else (model, model)
    urls = [getattr(u, "url", u) for u in (standard, fast)]
    settings = gateway_settings([urls[0]], [urls[1]], jobs=tree, **overrides)

    if ensure:
        JobStore(settings.jobs.storage).ensure_bucket()
        JobQueue(settings.jobs.kafka).ensure_topics()
    with running_gateway(settings, port=port) as base:
        stack = JobsStack(base, settings)
        try:
            yield stack
        finally:
            for w in stack.workers:
                w.stop(drain_seconds=0)


def topic_messages(jobs: JobsSettings, topic: str) -> list[dict[str, Any]]:
    """Every message on ``topic`` so far, read by a consumer of no group (commits nothing)."""
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=jobs.kafka.bootstrap_servers,
        auto_offset_reset="earliest",
        consumer_timeout_ms=5000,
        group_id=None,
    )
    try:
        return [json.loads(m.value) for m in consumer]
    finally:
        consumer.close()
