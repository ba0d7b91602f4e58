"""``tiergate serve --workers N``: N gateway processes sharing one port.

uvicorn's supervisor binds the port and starts N worker processes (spawned: each imports
the app afresh, after ``PROMETHEUS_MULTIPROC_DIR`` is set), and the kernel spreads the
connections over them. Each process is a whole gateway of its own:

- pools and health: every process polls the endpoints itself, so each knows their health;
  ``/healthz`` and ``/readyz`` answer for the process that takes the connection;
- metrics: counters and histograms are kept in files under ``PROMETHEUS_MULTIPROC_DIR``
  (Prometheus multiprocess mode) and ``/metrics``, from whichever process answers, adds up
  every process's; the gauges read at scrape time (endpoint health and in-flight,
  admission queue depth and in-flight, Redis state, tier evidence) are the answering
  process's own, and ``tiergate_up`` is the maximum over the processes;
- per-key limits without Redis and admission caps are counted by each process alone, so
  with N processes a key may get up to N times its limit and a tier N times its slots:
  set ``limits.redis_url`` to count limits across processes, or stay at one worker.

``--workers 1`` (the default) does none of this: one process, metrics in memory.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from fastapi import FastAPI

from tiergate.settings import Settings

# What the workers are handed through their environment: the settings tree's own names
# for the metrics folder (prometheus_client reads it there too) and for --host/--port.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_HOST_ENV = "TIERGATE_GATEWAY__HOST"
_PORT_ENV = "TIERGATE_GATEWAY__PORT"


def serve_workers(settings: Settings, workers: int) -> None:
    """Run ``workers`` gateway processes on ``settings.gateway``'s host and port."""
    import uvicorn

    from tiergate.gateway.serving import uvicorn_options

    gateway = settings.gateway
    made: str | None = None
    folder = settings.prometheus_multiproc_dir
    if folder is None:
        made = folder = tempfile.mkdtemp(prefix="tiergate-metrics-")
        os.environ[MULTIPROC_ENV] = folder
    else:
        # Files left by an earlier run would be counted again.
        Path(folder).mkdir(parents=True, exist_ok=True)
        for stale in Path(folder).glob("*.db"):
            stale.unlink()
    # The workers load the settings as this process did, --host/--port included.
    os.environ[_HOST_ENV] = gateway.host
    os.environ[_PORT_ENV] = str(gateway.port)
    try:
        uvicorn.run(
            "tiergate.gateway.workers:worker_app",
            factory=True,
            workers=workers,
            host=gateway.host,
            port=gateway.port,
            **uvicorn_options(gateway),
        )
    finally:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)


def worker_app() -> FastAPI:
    """The app of one worker process (uvicorn's factory)."""
    from tiergate.gateway.app import create_app
    from tiergate.gateway.logs import configure_logging
    from tiergate.settings import load_settings

    settings = load_settings()
    configure_logging(settings.log_level)
    return create_app(settings)
