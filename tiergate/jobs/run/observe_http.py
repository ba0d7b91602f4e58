"""The worker's small HTTP face: ``GET /metrics`` and ``GET /healthz``.

A stdlib ThreadingHTTPServer in a daemon thread: the worker has no event loop, and
Prometheus and the kubelet are its only clients.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tiergate.jobs.run.observe import Liveness, WorkerMetrics

log = logging.getLogger("tiergate.worker.http")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        metrics: WorkerMetrics,
        liveness: Liveness,
        facts: Callable[[], dict[str, Any]],
    ) -> None:
        super().__init__(address, _Handler)
        self.metrics = metrics
        self.liveness = liveness
        self.facts = facts


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = 10  # a client that sends nothing does not hold a thread for long

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self.server.metrics.observe_liveness(self.server.liveness)
            self._reply(200, generate_latest(self.server.metrics.registry), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            ok, threads = self.server.liveness.healthy()
            body: dict[str, Any] = {"status": "ok" if ok else "unhealthy", "threads": threads}
            body.update(self.server.facts())
            if not ok:
                body["failing"] = sorted(n for n, t in threads.items() if not t["ok"])
            self._reply(200 if ok else 503, json.dumps(body).encode(), "application/json")
        else:
            self._reply(404, b'{"error": "not found"}', "application/json")

    def _reply(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


class WorkerHTTP:
    """Serves ``metrics`` and ``liveness`` on ``host:port`` (port 0: a free one, then
    :attr:`port` says which) from :meth:`start` until :meth:`stop`."""

    def __init__(
        self,
        metrics: WorkerMetrics,
        liveness: Liveness,
        host: str = "0.0.0.0",
        port: int = 9400,
        facts: Callable[[], dict[str, Any]] = dict,
    ) -> None:
        self._metrics = metrics
        self._liveness = liveness
        self._facts = facts  # more of /healthz's body (the groups' assignors)
        self._address = (host, port)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("WorkerHTTP is not started")
        return int(self._server.server_address[1])

    def start(self) -> WorkerHTTP:
        """Bind (an ``OSError`` says why not) and serve in a daemon thread."""
        if self._server is not None:
            return self
        self._server = _Server(self._address, self._metrics, self._liveness, self._facts)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="worker-http",
            daemon=True,
        )
        self._thread.start()
        log.info("worker metrics and health on %s:%d", self._address[0], self.port)
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
