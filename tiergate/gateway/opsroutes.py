"""Operations routes: liveness, readiness and (only where the operator opts in,
``gateway.metrics_on_serving_port``) ``/metrics``."""

from __future__ import annotations

import orjson
from fastapi import FastAPI, Request
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import PlainTextResponse, Response

from tiergate.gateway.state import GatewayState, gateway_state
from tiergate.settings import Settings
from tiergate.tiers import Tier


def _json(data: object, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def tiers_serving(state: GatewayState) -> tuple[bool, dict[str, bool]]:
    """Whether every tier has a healthy endpoint or can fall back to one that has, and
    each tier's own availability."""
    tiers = {tier.value: pool.has_available() for tier, pool in state.pools.items()}
    policy = state.settings.policy
    serving = all(
        ok
        or (policy.fallback and any(tiers[o.value] for o in policy.fallback_order.get(Tier(t), ())))
        for t, ok in tiers.items()
    )
    return serving, tiers


def register_ops_routes(app: FastAPI, settings: Settings) -> None:
    @app.get("/healthz", tags=["ops"])
    async def healthz() -> Response:
        """Liveness: the process answers."""
        return _json({"status": "ok"})

    @app.get("/readyz", tags=["ops"])
    async def readyz(request: Request) -> Response:
        """Readiness: the gateway answers its own routes (models, tiers, jobs, and errors
        with retry-after), so it stays ready while a tier is down: a vLLM rollout must not
        take every gateway replica out of its Service. The body tells whether the tiers can
        serve (``tiers_serving``) and each tier's health; the status code does not."""
        serving, tiers = tiers_serving(gateway_state(request))
        return _json({"ready": True, "tiers_serving": serving, "tiers": tiers})

    if not settings.gateway.metrics_on_serving_port:
        return  # served by tiergate.gateway.metricsport on its own port only

    @app.get(
        "/metrics",
        tags=["ops"],
        response_class=PlainTextResponse,
        responses={200: {"content": {"text/plain": {}}, "description": "Prometheus metrics"}},
    )
    async def metrics(request: Request) -> Response:
        return Response(gateway_state(request).metrics.scrape(), media_type=CONTENT_TYPE_LATEST)
