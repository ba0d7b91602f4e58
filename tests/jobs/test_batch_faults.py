"""OpenAI batches through crashes (issue 35, item 3): every input line answered exactly once
whatever dies. Real broker (Tansu), real S3 API server (SeaweedFS), FakeVllm behind:

- a gateway that dies after recording a batch and before sending all of its chunks (the
  death is a fault injected into the gateway's enqueue: what was sent stays sent, nothing is
  undone, as when the process is killed there): the workers' sweep sends the missing
  chunks again, once each;
- a gateway that dies before the batch object is written: its markers are swept, and the
  key's enqueued quota is given back;
- real ``tiergate worker`` processes killed with SIGKILL mid-chunk, the broker restarted and
  a real ``tiergate serve`` gateway killed and started again, during one batch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.jobstack import jobs_stack, jobs_tree
from tests.servers import free_port
from tests.waiting import eventually
from tiergate.gateway.jobs.openaibatch.api import BatchAPI
from tiergate.jobs.lines.store import LineBatchStore
from tiergate.jobs.state.store import JobStore
from tiergate.local.jobs import start_worker
from tiergate.local.servers import ObjectStore, Server

REQUEUE = 3.0  # requeue_after_seconds: the sweep sends a missing chunk again after it
FINAL = {"completed", "failed", "cancelled", "expired"}
# What the client sees of a gateway dying mid-request: a 500, or the connection reset.
DIED = (openai.InternalServerError, openai.APIConnectionError)


class GatewayDied(Exception):
    """The gateway's process ends here: no undo runs, nothing more is sent."""


def _line(i: int) -> dict[str, Any]:
    return {
        "custom_id": f"request-{i}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": MODEL, "messages": [{"role": "user", "content": f"hi {i}"}]},
    }


def _jsonl(count: int) -> bytes:
    return b"".join(json.dumps(_line(i)).encode() + b"\n" for i in range(count))


def _custom_ids(client: openai.OpenAI, batch: Any) -> list[str]:
    ids = []
    for file_id in (batch.output_file_id, batch.error_file_id):
        if file_id is not None:
            text = client.files.content(file_id).text
            ids += [json.loads(line)["custom_id"] for line in text.splitlines() if line]
    return ids


def _reconnected(base: str) -> openai.OpenAI:
    """A client with connections of its own, as a caller has after a gateway died under its
    request: the connection that request used is closed by the server, and a client that
    kept it could send its next request into the reset (seen once in CI)."""
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)


def _final(client: openai.OpenAI, batch_id: str, timeout: float) -> Any:
    seen: list[Any] = []

    def reached() -> bool:
        try:
            seen[:] = [client.batches.retrieve(batch_id)]
        except (openai.APIConnectionError, openai.InternalServerError):
            return False  # the gateway is restarting
        return seen[0].status in FINAL

    eventually(reached, timeout, 0.5, lambda: f"batch {batch_id} final: {seen}")
    return seen[0]


def test_a_batch_whose_gateway_died_mid_send_is_answered_once_by_the_sweep(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = BatchAPI._enqueue

    def dying(self: BatchAPI, owner: str, batch: dict[str, Any], plan: list[list[int]]) -> None:
        real(self, owner, batch, plan[:2])  # two chunks reach the broker, then the end
        raise GatewayDied

    monkeypatch.setattr(BatchAPI, "_enqueue", dying)
    jobs = {"requeue_after_seconds": REQUEUE, "batch_api": {"chunk_lines": 3}}
    with jobs_stack(broker, s3, model, tmp_path, jobs=jobs) as stack:
        client = openai.OpenAI(base_url=f"{stack.base}/v1", api_key="unused", max_retries=0)
        upload = client.files.create(file=("in.jsonl", _jsonl(14)), purpose="batch")
        with pytest.raises(DIED):
            client.batches.create(
                input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
        client = _reconnected(stack.base)
        (batch,) = client.batches.list().data  # recorded before its chunks were sent
        assert batch.status == "in_progress" and batch.request_counts.total == 14
        worker = stack.start_worker()
        done = _final(client, batch.id, 120)
        assert done.status == "completed", done
        assert done.request_counts.completed == 14
        ids = _custom_ids(client, done)
        assert sorted(ids) == sorted(f"request-{i}" for i in range(14))  # each exactly once
        # Five chunks of 3, 3, 3, 3, 2 lines: the three never sent, sent again once each.
        resent = worker.metrics.registry.get_sample_value(
            "tiergate_openai_batch_chunks_resent_total"
        )
        assert resent == 3
        lines = worker.metrics.registry.get_sample_value(
            "tiergate_openai_batch_lines_total", {"outcome": "completed"}
        )
        assert lines == 14


def test_markers_of_a_batch_whose_gateway_died_before_recording_it_are_swept(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def dying_create(
        self: LineBatchStore, owner: str, batch: dict[str, Any], plan: Any, tokens: int
    ) -> None:
        # The plan and the markers, then the end, before the batch object.
        self.objects.put(self._key(owner, batch["id"], "plan.json"), json.dumps(plan).encode())
        lines = int(batch["request_counts"]["total"])
        self.objects.put(f"{self._open}{owner}/{batch['id']}", b"")
        self.objects.put(self._active_key(owner, batch["id"], lines, tokens), b"")
        raise GatewayDied

    monkeypatch.setattr(LineBatchStore, "create", dying_create)
    jobs = {"requeue_after_seconds": REQUEUE, "batch_api": {"max_active_batches": 1}}
    with jobs_stack(broker, s3, model, tmp_path, jobs=jobs) as stack:
        client = openai.OpenAI(base_url=f"{stack.base}/v1", api_key="unused", max_retries=0)
        upload = client.files.create(file=("in.jsonl", _jsonl(4)), purpose="batch")
        with pytest.raises(DIED):
            client.batches.create(
                input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
        client = _reconnected(stack.base)
        assert client.batches.list().data == []  # nothing was accepted
        lines = LineBatchStore(JobStore(stack.jobs.storage))
        ((owner, _),) = lines.open_batches()
        assert lines.enqueued(owner)[0] == 1  # the dead create holds the key's one batch
        monkeypatch.undo()
        stack.start_worker()
        eventually(lambda: lines.enqueued(owner) == (0, 0, 0), 60, 0.3, "the markers swept")
        assert lines.open_batches() == []
        batch = client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert _final(client, batch.id, 120).status == "completed"


class _Gateway:
    """``tiergate serve`` on a fixed port, killed and started again on demand."""

    def __init__(self, config: Path, port: int, log: Path) -> None:
        self.config, self.port, self.log = config, port, log
        self.base = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {
            **os.environ,
            "TIERGATE_CONFIG": str(self.config),
            "TIERGATE_GATEWAY__PORT": str(self.port),
        }
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tiergate", "serve"], env=env, stdout=out, stderr=out
            )

        def ready() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                return httpx.get(f"{self.base}/readyz").status_code == 200
            except httpx.TransportError:
                return False

        eventually(ready, 60, 0.2, "the gateway ready")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def test_a_batch_through_killed_workers_a_broker_restart_and_a_killed_gateway(
    pipeline: tuple[ObjectStore, Server], model: FakeVllm, tmp_path: Path
) -> None:
    store_server, broker_server = pipeline
    model.behaviour.chunk_delay = 0.05
    port = free_port()
    jobs = jobs_tree(broker_server.address, store_server.url, f"http://127.0.0.1:{port}", tmp_path)
    jobs["requeue_after_seconds"] = REQUEUE
    jobs["batch_api"] = {"chunk_lines": 4, "line_concurrency": 2}
    jobs["kafka"]["session_timeout_ms"] = 3000
    jobs["worker"]["metrics_port"] = 0  # two workers on one machine
    config = tmp_path / "tiergate.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "tiers": {
                    "standard": {"endpoints": [model.url]},
                    "fast": {"endpoints": [model.url]},
                },
                "health": {"interval_seconds": 0.5},
                "gateway": {"log_requests": False, "metrics_port": None},
                "jobs": jobs,
            }
        )
    )
    gateway = _Gateway(config, port, tmp_path / "gateway.log")
    gateway.start()
    log = tmp_path / "workers.log"
    workers: list[subprocess.Popen[bytes]] = []
    try:
        client = openai.OpenAI(base_url=f"{gateway.base}/v1", api_key="unused")
        upload = client.files.create(file=("in.jsonl", _jsonl(120)), purpose="batch")
        batch = client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        env = {**os.environ, "TIERGATE_CONFIG": str(config)}
        workers = [start_worker(env, log), start_worker(env, log)]
        faults: list[str] = []
        while len(faults) < 5:
            eventually(
                lambda: (
                    client.batches.retrieve(batch.id).request_counts.completed
                    >= 12 * (len(faults) + 1)
                ),
                120,
                0.3,
                lambda: f"progress before fault {len(faults) + 1}; see {log}",
            )
            fault = ("worker", "broker", "worker", "gateway", "worker")[len(faults)]
            if fault == "worker":  # mid-chunk: its lines are running
                victim = workers.pop(0)
                victim.send_signal(signal.SIGKILL)
                victim.wait()
                workers.append(start_worker(env, log))
            elif fault == "broker":
                broker_server.restart()
            else:
                gateway.kill()
                time.sleep(1)  # a crash, then a restart: the workers' lines meet no gateway
                gateway.start()
            faults.append(fault)
        done = _final(client, batch.id, 300)
        assert done.status == "completed", (done, log.read_text()[-3000:])
        assert done.request_counts.completed == 120 and done.request_counts.failed == 0
        ids = _custom_ids(client, done)
        assert sorted(ids) == sorted(f"request-{i}" for i in range(120)), "each exactly once"
    finally:
        for proc in workers:
            proc.kill()
            proc.wait()
        if gateway.proc is not None:
            gateway.proc.kill()
            gateway.proc.wait()
