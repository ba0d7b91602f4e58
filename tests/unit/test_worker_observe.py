"""The worker's metrics, liveness and their HTTP face (no broker needed)."""

from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tiergate.jobs.run.observe import Liveness, WorkerMetrics
from tiergate.jobs.run.observe_http import WorkerHTTP
from tiergate.jobsettings import WorkerSettings
from tiergate.protocol import JobStatus


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def served() -> Iterator[tuple[WorkerMetrics, Liveness, WorkerHTTP]]:
    metrics, liveness = WorkerMetrics(), Liveness(stale_after=30)
    http = WorkerHTTP(metrics, liveness, host="127.0.0.1", port=0).start()
    yield metrics, liveness, http
    http.stop()


def get(http: WorkerHTTP, path: str) -> tuple[int, str, str]:
    url = f"http://127.0.0.1:{http.port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_are_exposed_with_their_names_and_labels(
    served: tuple[WorkerMetrics, Liveness, WorkerHTTP],
) -> None:
    metrics, liveness, http = served
    metrics.set_lags("tiergate-jobs", {0: 3, 1: 0})
    metrics.finished(JobStatus.FAILED, "sandbox")
    metrics.finished("completed", "ok")
    metrics.finished("completed", "ok")
    with metrics.running():
        _, _, during = get(http, "/metrics")
    with metrics.step():
        pass
    metrics.observe_sandbox("verifier", 0.3)
    with metrics.sandbox("command"):
        pass
    metrics.retried()
    metrics.dead_lettered()
    liveness.register("job-slot-0")

    status, content_type, text = get(http, "/metrics")
    assert status == 200 and content_type.startswith("text/plain")
    got = samples(text)
    assert samples(during)[("tiergate_jobs_running", ())] == 1
    assert got[("tiergate_jobs_running", ())] == 0
    lag = "tiergate_jobs_queue_lag"
    assert got[(lag, (("partition", "0"), ("topic", "tiergate-jobs")))] == 3
    assert got[(lag, (("partition", "1"), ("topic", "tiergate-jobs")))] == 0
    finished = "tiergate_jobs_finished_total"
    assert got[(finished, (("reason", "sandbox"), ("status", "failed")))] == 1
    assert got[(finished, (("reason", "ok"), ("status", "completed")))] == 2
    assert got[("tiergate_jobs_step_seconds_count", ())] == 1
    assert got[("tiergate_jobs_sandbox_seconds_count", (("phase", "verifier"),))] == 1
    assert got[("tiergate_jobs_sandbox_seconds_count", (("phase", "command"),))] == 1
    assert got[("tiergate_jobs_retries_total", ())] == 1
    assert got[("tiergate_jobs_dead_lettered_total", ())] == 1
    assert got[("tiergate_worker_thread_alive", (("thread", "job-slot-0"),))] == 1


def test_sandbox_failures_series_exists_before_the_first_failure() -> None:
    got = samples(_exposition(WorkerMetrics()))
    assert got[("tiergate_jobs_finished_total", (("reason", "sandbox"), ("status", "failed")))] == 0


def _exposition(metrics: WorkerMetrics) -> str:
    from prometheus_client import generate_latest

    return generate_latest(metrics.registry).decode()


def test_metrics_refuse_unbounded_labels() -> None:
    metrics = WorkerMetrics()
    with pytest.raises(ValueError, match="terminal"):
        metrics.finished("in_progress", "ok")
    with pytest.raises(ValueError, match="short code"):
        metrics.finished("failed", "Traceback: something broke at line 3")
    with pytest.raises(ValueError, match="phase"):
        metrics.observe_sandbox("teardown", 1.0)


def test_instances_do_not_share_state() -> None:
    first, second = WorkerMetrics(), WorkerMetrics()
    first.retried()
    assert samples(_exposition(second))[("tiergate_jobs_retries_total", ())] == 0


def test_healthz_turns_503_and_names_the_thread_that_died(
    served: tuple[WorkerMetrics, Liveness, WorkerHTTP],
) -> None:
    _, liveness, http = served
    release = threading.Event()
    alive = threading.Thread(target=release.wait, name="retries", daemon=True)
    doomed = threading.Thread(target=lambda: None, name="job-slot-1", daemon=True)
    liveness.register("retries", alive)
    liveness.register("job-slot-1", doomed)
    alive.start()
    status, content_type, body = get(http, "/healthz")
    assert status == 200 and content_type == "application/json"
    assert json.loads(body)["status"] == "ok"

    doomed.start()
    doomed.join(5)
    status, _, body = get(http, "/healthz")
    report: dict[str, Any] = json.loads(body)
    assert status == 503
    assert report["status"] == "unhealthy"
    assert report["failing"] == ["job-slot-1"]
    assert report["threads"]["job-slot-1"]["state"] == "dead"
    assert report["threads"]["retries"]["ok"] is True
    _, _, text = get(http, "/metrics")
    alive_gauge = samples(text)
    assert alive_gauge[("tiergate_worker_thread_alive", (("thread", "job-slot-1"),))] == 0
    assert alive_gauge[("tiergate_worker_thread_alive", (("thread", "retries"),))] == 1

    # Draining: threads that end are expected.
    liveness.stopping()
    status, _, body = get(http, "/healthz")
    assert status == 200, body
    assert json.loads(body)["threads"]["job-slot-1"]["state"] == "stopped"
    release.set()
    alive.join(5)


def test_a_stale_heartbeat_is_unhealthy_unless_busy() -> None:
    clock = Clock()
    liveness = Liveness(stale_after=30, clock=clock)
    liveness.register("job-slot-0")  # the calling thread: alive
    liveness.register("lag", stale_after=float("inf"))
    clock.now += 29
    assert liveness.healthy()[0]
    clock.now += 2
    ok, threads = liveness.healthy()
    assert not ok
    assert threads["job-slot-0"]["state"] == "stale"
    assert threads["lag"]["state"] == "ok"
    liveness.beat("job-slot-0")
    assert liveness.healthy()[0]

    with liveness.busy("job-slot-0"):  # a job runs for hours without beating
        clock.now += 3600
        ok, threads = liveness.healthy()
        assert ok and threads["job-slot-0"]["state"] == "busy"
    assert liveness.healthy()[0]  # the end of the job counts as a beat
    clock.now += 31
    assert not liveness.healthy()[0]
    liveness.unregister("job-slot-0")
    assert liveness.healthy()[0]


def test_a_thread_registered_before_it_starts_is_starting() -> None:
    liveness = Liveness()
    liveness.register("job-slot-0", threading.Thread(target=lambda: None))
    ok, threads = liveness.healthy()
    assert ok and threads["job-slot-0"]["state"] == "starting"


def test_port_zero_binds_a_free_port_and_stop_releases_it() -> None:
    http = WorkerHTTP(WorkerMetrics(), Liveness(), host="127.0.0.1", port=0)
    with pytest.raises(RuntimeError):
        _ = http.port
    http.start()
    port = http.port
    assert port > 0
    assert get(http, "/nope")[0] == 404
    # A second server cannot take the same port while the first holds it.
    with pytest.raises(OSError):
        WorkerHTTP(WorkerMetrics(), Liveness(), host="127.0.0.1", port=port).start()
    http.stop()
    with socket.create_server(("127.0.0.1", port)):
        pass


def test_settings_default_to_the_charts_port() -> None:
    settings = WorkerSettings()
    assert (settings.metrics_host, settings.metrics_port) == ("0.0.0.0", 9400)
    assert WorkerSettings(metrics_port=0).metrics_port == 0
    with pytest.raises(ValueError):
        WorkerSettings(metrics_port=70000)
