"""``/metrics`` on a listener of its own (``gateway.metrics_port``), so that the public port
(and an Ingress routing ``/`` to it) never exposes key names and endpoint addresses.

It runs on the gateway's event loop, started and stopped by the app's lifespan, and reads
the gateway's own registry: the collectors read pool and admission state that only the
event loop touches, so a scrape must not run on another thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

log = logging.getLogger("tiergate.gateway")


class MetricsListener:
    """Serves ``GET /metrics`` on ``host:port`` (port 0: a free one), the exposition text
    that ``scrape`` makes (:meth:`~tiergate.gateway.metrics.GatewayMetrics.scrape`)."""

    def __init__(
        self, scrape: Callable[[], bytes], host: str, port: int, *, reuse_port: bool = False
    ) -> None:
        self._scrape = scrape
        self._host = host
        self._port = port
        # With several worker processes each one listens (SO_REUSEPORT) and any of them
        # answers a scrape with every process's counters.
        self._reuse_port = reuse_port
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(
            runner, self._host, self._port, reuse_port=True if self._reuse_port else None
        )
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = int(sockets[0].getsockname()[1]) if sockets else self._port
        log.info("metrics on http://%s:%d/metrics", self._host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _metrics(self, request: web.Request) -> web.Response:
        body = self._scrape()
        return web.Response(body=body, headers={"content-type": CONTENT_TYPE_LATEST})
