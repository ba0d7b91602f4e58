"""Agent jobs in the one-command stack: the durable object store and broker, and one
worker process, started beside the tiers and stopped with them.

The gateway and the worker get the same ``jobs`` settings: the worker as the
``TIERGATE_JOBS`` environment variable (JSON), which pydantic-settings reads.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from tiergate.jobsettings import JobsSettings
from tiergate.local.private import private_dir
from tiergate.local.servers import (
    LOCAL_CREDENTIALS,
    ObjectStore,
    Server,
    ServerFailed,
    broker,
    ensure_bucket,
    object_store,
)
from tiergate.local.supervisor import Child, Supervisor, kill_leftovers
from tiergate.measure.ports import port_open
from tiergate.measure.wait import wait_until
from tiergate.settings import Settings


@dataclass(frozen=True)
class LocalPorts:
    """Where the local job servers listen: the ``local`` settings (tests pick free ones)."""

    s3: int
    broker: int
    worker_health: int

    @classmethod
    def configured(cls, settings: Settings) -> LocalPorts:
        local = settings.local
        return cls(local.s3_port, local.broker_port, local.worker_health_port)


def local_jobs_settings(settings: Settings, ports: LocalPorts) -> JobsSettings:
    """Jobs on, against the local servers, with the gateway this stack serves."""
    jobs = settings.jobs.model_copy(deep=True)
    jobs.enabled = True
    jobs.gateway_url = f"http://127.0.0.1:{settings.gateway.port}"
    jobs.storage.endpoint_url = f"http://127.0.0.1:{ports.s3}"
    jobs.kafka.bootstrap_servers = f"127.0.0.1:{ports.broker}"
    jobs.worker.metrics_host = "127.0.0.1"
    jobs.worker.metrics_port = ports.worker_health
    # Ctrl-C should not wait a minute: a job still running is picked up again next time.
    jobs.worker.drain_seconds = min(jobs.worker.drain_seconds, 10.0)
    if os.geteuid() != 0:
        # /var/lib is root's; the sandbox's work directory and the environments' cache move
        # to the user's cache.
        jobs.sandbox.work_dir = str(settings.cache_dir / "sandboxes")
        jobs.sandbox.cache_dir = str(settings.cache_dir / "worker")
    return jobs


def _start_or_reuse(server: Server, say: Callable[[str], None]) -> bool:
    """Start ``server`` unless something already answers on its port (a stack started
    earlier); True when this call started it."""
    if port_open(server.port):
        say(f"{server.name} already running on {server.address}; reusing it")
        return False
    say(f"starting the {server.name} on {server.address} (log: {server.log})")
    server.start()
    return True


def _wait_healthy(
    proc: subprocess.Popen[bytes], log: Path, port: int, timeout: float = 90.0
) -> None:
    url = f"http://127.0.0.1:{port}/healthz"

    def healthy() -> bool:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-5:]
            raise ServerFailed("the job worker exited:\n  " + "\n  ".join(tail))
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(url, timeout=1.0).status_code == 200
        return False

    if not wait_until(healthy, timeout, 0.3):
        raise ServerFailed(f"the job worker is not healthy after {timeout:.0f}s; see {log}")


def start_worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """A ``tiergate worker`` process with ``env`` as its whole environment, its output
    appended to ``log``, in its own session (so that stopping it stops its sandboxes)."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tiergate", "worker"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _supervise_server(supervisor: Supervisor, server: Server) -> None:
    """Restart ``server`` (same ports and data) when it dies; ``server.proc`` stays the
    process to stop."""
    assert server.proc is not None

    def restart() -> subprocess.Popen[bytes]:
        if server.proc is not None:
            kill_leftovers(server.proc)
        server.start()
        assert server.proc is not None
        return server.proc

    supervisor.watch(server.name, server.proc, restart, server.log)


@contextlib.contextmanager
def local_jobs(
    settings: Settings,
    log_dir: Path,
    say: Callable[[str], None],
    *,
    data: Path | None = None,
    ports: LocalPorts | None = None,
    supervisor: Supervisor | None = None,
    default_environment: Path | None = None,
) -> Iterator[JobsSettings]:
    """Run the object store, the broker and a worker for the block; yields the jobs
    settings for the gateway. Data lives in ``data`` (default: the cache's ``pipeline``).
    With a ``supervisor``, each of the three that this call started is restarted when it
    dies (the caller stops the supervisor before the block ends). With a
    ``default_environment`` manifest, its environment is registered as ``default`` (built
    unless already built from it) before the worker starts (tiergate.local.environment);
    raises :class:`~tiergate.local.environment.DefaultEnvironmentFailed` if it cannot be."""
    for key, value in LOCAL_CREDENTIALS.items():
        os.environ.setdefault(key, value)
    ports = ports or LocalPorts.configured(settings)
    jobs = local_jobs_settings(settings, ports)
    data = private_dir(data or settings.cache_dir / "pipeline")
    store: ObjectStore = object_store(data, log_dir / "seaweedfs.log", ports.s3)
    kafka = broker(ports.broker, store.url, log_dir / "tansu.log")
    started: list[Server] = []
    worker: subprocess.Popen[bytes] | None = None
    watched: Child | None = None
    try:
        if _start_or_reuse(store, say):
            started.append(store)
        from tiergate.local.servers import BROKER_BUCKET

        ensure_bucket(store.url, BROKER_BUCKET)
        ensure_bucket(store.url, jobs.storage.bucket)
        if default_environment is not None:
            from tiergate.local.environment import ensure_default_environment

            ensure_default_environment(
                jobs, default_environment, say, work_dir=settings.cache_dir / "envs"
            )
        if _start_or_reuse(kafka, say):
            started.append(kafka)
        log = log_dir / "worker.log"
        say(f"starting a job worker ({jobs.worker.concurrency} slots; log: {log})")
        env = {**os.environ, "TIERGATE_JOBS": jobs.model_dump_json()}

        def again() -> subprocess.Popen[bytes]:
            return start_worker(env, log)

        worker = again()
        _wait_healthy(worker, log, ports.worker_health)
        if supervisor is not None:
            for server in started:
                _supervise_server(supervisor, server)
            watched = supervisor.watch("job worker", worker, again, log)
        say(
            f"jobs: object store {store.url} (data: {data}), broker {kafka.address}, "
            f"worker health http://127.0.0.1:{ports.worker_health}/healthz"
        )
        yield jobs
    finally:
        if watched is not None:
            worker = watched.proc
        if worker is not None and worker.poll() is None:
            say("stopping the job worker")
            worker.terminate()
            try:
                worker.wait(jobs.worker.drain_seconds + 15)
            except subprocess.TimeoutExpired:
                worker.kill()
        for server in reversed(started):
            say(f"stopping the {server.name}")
            server.stop()
