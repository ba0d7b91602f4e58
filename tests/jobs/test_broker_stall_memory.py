"""A broker that stops answering (SIGSTOP: a GC pause, a partition) must not grow a worker's
memory for as long as kafka-python waits on it. kafka-python 3.0.12's consumer busy-loops
while a fetch hangs, keeping what each turn allocates until the fetch times out: at its
default request timeout (30 s) a worker grew by hundreds of MB per stall, the whole fleet
at once, in a pod whose headroom beside its jobs is 512 MiB (seen in the soak: +100 MB per
8 s stall, +180 MB per 15 s). The workers' consumers now time requests out after
``kafka.consumer_request_timeout_seconds`` (10 s): past it a worker's memory stops
growing. Real broker, store and worker processes; the model is the fake."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tests.fakes.fake_vllm import FakeVllm
from tests.jobs.test_scaling import REPLY, task
from tests.jobs.workerfleet import fleet
from tests.jobstack import jobs_stack
from tiergate.local.servers import ObjectStore, Server

TERMINAL = ("completed", "failed", "cancelled", "incomplete")


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def test_a_stalled_broker_stops_growing_a_workers_memory_after_the_request_timeout(
    pipeline: tuple[ObjectStore, Server], model: FakeVllm, tmp_path: Path
) -> None:
    store, broker_server = pipeline
    model.behaviour.replies = [REPLY]
    assert broker_server.proc is not None
    with (
        jobs_stack(broker_server.address, store.url, model, tmp_path) as stack,
        fleet(stack, tmp_path, concurrency=1) as workers,
    ):
        worker = workers.start()
        first = stack.submit(task("touch done"))
        stack.wait(first["id"], lambda j: j["status"] in TERMINAL, 90)  # its consumers run
        os.kill(broker_server.proc.pid, signal.SIGSTOP)
        try:
            stalled = time.monotonic()
            time.sleep(13)  # every request in flight at the stall has timed out (10 s)
            settled = _rss_mb(worker.pid)
            time.sleep(19 - (time.monotonic() - stalled))
            later = _rss_mb(worker.pid)
        finally:
            os.kill(broker_server.proc.pid, signal.SIGCONT)
        # At kafka-python's default (30 s) it still grew here, about 20 MB a second.
        assert later - settled < 25, (settled, later)
        # And the worker takes jobs again once the broker answers.
        second = stack.submit(task("touch done"))
        stack.wait(second["id"], lambda j: j["status"] in TERMINAL, 120)
