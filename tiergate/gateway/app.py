"""The gateway application: collaborators built in the lifespan, thin routes over them."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request as StarletteRequest
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from tiergate import __version__
from tiergate.backends.pool import TierPool
from tiergate.fitting import Fitting
from tiergate.gateway import openapi
from tiergate.gateway.access.admission import Admission
from tiergate.gateway.access.collector import AdmissionCollector
from tiergate.gateway.access.gatekeeper import Gatekeeper
from tiergate.gateway.access.limits import Limiter
from tiergate.gateway.access.models import ServedModels
from tiergate.gateway.errors import OpenAIError
from tiergate.gateway.jobs.fileroutes import register_file_routes
from tiergate.gateway.jobs.openaibatch.routes import add_batch_components, register_batch_routes
from tiergate.gateway.jobs.routes import add_job_components, register_job_routes
from tiergate.gateway.logs import AccessLog
from tiergate.gateway.metrics import GatewayMetrics
from tiergate.gateway.metricsport import MetricsListener
from tiergate.gateway.openai.proxy import CompletionsProxy
from tiergate.gateway.openai.routes import ROUTES, Route
from tiergate.gateway.openai.upstreamhttp import UpstreamClient
from tiergate.gateway.opsroutes import register_ops_routes
from tiergate.gateway.serving import BodyReadDeadline
from tiergate.gateway.state import (
    GatewayState,
    built_gateway_state,
    gateway_state,
    install_gateway_state,
)
from tiergate.gateway.tierinfo import TierEvidence, TierEvidenceCollector
from tiergate.settings import Settings
from tiergate.tiers import Tier

if TYPE_CHECKING:
    from tiergate.gateway.jobs.wiring import JobsWiring

log = logging.getLogger("tiergate.gateway")


PROXIED_PATHS = frozenset(ROUTES)
# How long a proxied request's connection to an engine may wait idle for the next one.
UPSTREAM_KEEPALIVE_SECONDS = 30.0
# The cyclic collector's first threshold while the gateway serves (CPython's default: 700).
# A proxied request allocates about a hundred tracked objects, nearly all freed by reference
# counting when it ends; at the default, the requests in flight set off a young collection
# every few requests, and a collection of the older generations every few dozen (about a
# fifth of a proxied request's CPU at saturation, measured on an AMD EPYC and an Intel Xeon).
# At this threshold the young generation holds up to this many objects (a few MB) between
# collections, each of which then takes a few ms; cycles (exceptions and their tracebacks)
# are still collected.
GC_YOUNG_THRESHOLD = 100_000


class GatewayApp(FastAPI):
    """FastAPI, with the proxied routes, the gateway's hot path, served without the
    framework's per-request machinery (routing, exception middlewares, the endpoint's
    dependency solving: about a third of the CPU a proxied request cost). The routes stay
    registered for the OpenAPI description and for what does not match here exactly (other
    methods answer 405, a root path goes the usual way); what they did is done here: the
    body read deadline (408), :class:`OpenAIError` to its response, anything else to a
    logged 500 ``internal_error``."""

    # Made once, when the lifespan has built the gateway's state (an attribute lookup on
    # the app's State and a middleware object per request cost about 3% of its CPU).
    hot_path: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hot = self.hot_path
        if (
            hot is not None
            and scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"] in PROXIED_PATHS
            and not scope.get("root_path")
        ):
            scope["app"] = self
            await hot(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def _hot_path(state: GatewayState, body_read_timeout_seconds: float) -> ASGIApp:
    async def endpoint(scope: Scope, receive: Receive, send: Send) -> None:
        await _completion_endpoint(state, scope, receive, send)

    return BodyReadDeadline(endpoint, body_read_timeout_seconds)


async def _tick(admission: Admission, limiter: Limiter, every: float) -> None:
    """The admission clock: the patient lanes' and flow control's limits rise when
    interactive callers are quiet even if no request arrives (PatientLane.tick), and the
    served-token counts are shared through Redis where the limits are (ServedTokens.sync)."""
    while True:
        await asyncio.sleep(every)
        admission.tick()
        redis = limiter.redis_client
        if redis is not None and limiter.shared:
            try:
                await admission.sync_served(redis)
            except Exception as exc:  # counted alone until Redis answers again
                limiter.redis_failed(exc)


async def _watch_fitting(
    fitting: Fitting, pools: dict[Tier, TierPool], admission: Admission, every: float = 0.5
) -> None:
    """Take the local stack's fast tier in once it is proven (tiergate.fitting): the pools
    first (new engines checked before they can be chosen), then the policy's switch."""
    # Polled: the join is made in the stack's fitting thread, which an asyncio.Event of
    # this loop would not hear safely; half a second is nothing beside minutes of fitting.
    while (joined := fitting.take_join()) is None:  # noqa: ASYNC110
        await asyncio.sleep(every)
    try:
        for tier, urls in joined.endpoints.items():
            await pools[tier].set_endpoints(urls)
    except Exception as exc:  # the policy keeps the standard tier serving, and says why
        log.exception("the fast tier could not join")
        fitting.fail(f"the gateway could not take the fast tier in: {exc}")
        return
    if joined.shared_engines:
        admission.share_patient_lane()
    fitting.mark_joined(joined)
    log.info(
        "the fast tier joined",
        extra={"fields": {tier.value: list(pool.endpoints) for tier, pool in pools.items()}},
    )


async def _completion_endpoint(
    state: GatewayState, scope: Scope, receive: Receive, send: Send
) -> None:
    request = StarletteRequest(scope, receive, send)
    try:
        response = await state.proxy.handle(request, scope["path"])
    except OpenAIError as exc:
        response = exc.to_response()
    except Exception:
        log.exception("unhandled error")
        response = OpenAIError(500, "Internal gateway error.", code="internal_error").to_response()
    await response(scope, receive, send)


def upstream_session() -> aiohttp.ClientSession:
    """The client of the pools' own requests to the engines (health checks, load scrapes,
    model and route lists); the proxied requests go through
    :class:`~tiergate.gateway.openai.upstreamhttp.UpstreamClient`. Connections kept alive and
    reused (no limit on how many, 30 s idle), each with TCP_NODELAY (aiohttp sets it on
    every connection it opens). No cookie jar: a cookie one answer set (a sticky load
    balancer's in front of the engines) must not ride on later requests (aiohttp's default
    jar keeps cookies of named hosts and sends them on)."""
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=10, keepalive_timeout=30)
    return aiohttp.ClientSession(
        connector=connector,
        cookie_jar=aiohttp.DummyCookieJar(),
        json_serialize=lambda o: orjson.dumps(o).decode(),
    )


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def create_app(settings: Settings, fitting: Fitting | None = None) -> FastAPI:
    """Build the gateway for a settings tree; nothing starts until the app's lifespan.
    ``fitting``: the local stack's fast tier, fitted while this gateway serves (it joins
    when proven; until then the standard tier serves its requests)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        session = upstream_session()
        pools = {
            tier: TierPool(tier, settings.tiers[tier], settings.health, settings.routing, session)
            for tier in Tier
        }
        metrics = GatewayMetrics(pools, settings.prometheus_multiproc_dir)
        limiter = Limiter(settings.limits)
        listed = [set(settings.tiers[t].endpoints) for t in (Tier.STANDARD, Tier.FAST)]
        admission = Admission(
            settings.admission,
            {tier: bool(settings.tiers[tier].long_context_endpoints) for tier in Tier},
            shared_engines=bool(listed[0]) and listed[0] == listed[1],
        )
        metrics.registry.register(AdmissionCollector(admission, limiter))
        evidence = TierEvidence(
            settings.gateway.tier_evidence_file,
            settings.policy.engine_priorities,
            shared_engines=bool(listed[0]) and listed[0] == listed[1],
            engine_modes=settings.gateway.engine_modes,
            engine_count=len(listed[0] | listed[1]),
            fitting=fitting,
        )
        metrics.registry.register(TierEvidenceCollector(evidence))
        gatekeeper = Gatekeeper(
            settings,
            limiter,
            admission,
            metrics,
            lambda tier, path: pools[tier].serves_route(path),
            ServedModels(pools),
            fitting.unready_reason if fitting is not None else None,
        )
        access_log = AccessLog(sys.stderr.buffer) if settings.gateway.log_requests else None
        upstream = UpstreamClient(keepalive_seconds=UPSTREAM_KEEPALIVE_SECONDS)
        proxy = CompletionsProxy(settings, pools, upstream, metrics, gatekeeper, access_log)
        state = GatewayState(settings, session, pools, metrics, proxy, gatekeeper, evidence)
        install_gateway_state(app, state)
        wiring: JobsWiring | None = None
        if settings.jobs.enabled:
            # Imported here: a gateway without jobs loads no kafka, boto3 or job store.
            from tiergate.gateway.jobs.wiring import build_jobs

            wiring = build_jobs(settings, gatekeeper)
            state.jobs, state.batches = wiring.jobs, wiring.batches
            state.files, state.openai_batches = wiring.files, wiring.openai_batches
        for pool in pools.values():
            await pool.start()
        ticking = asyncio.create_task(
            _tick(admission, limiter, settings.admission.patient.adjust_seconds)
        )
        joining = (
            asyncio.create_task(_watch_fitting(fitting, pools, admission))
            if fitting is not None
            else None
        )
        if isinstance(app, GatewayApp):
            app.hot_path = _hot_path(state, settings.gateway.body_read_timeout_seconds)
        # What start-up built (settings, the OpenAPI models, the pools) lives as long as the
        # process: out of the collector's sight, a collection no longer walks it while a
        # request waits (the cyclic collector runs every few requests).
        gc.collect()
        gc.freeze()
        gc_thresholds = gc.get_threshold()
        gc.set_threshold(GC_YOUNG_THRESHOLD, *gc_thresholds[1:])
        log.info(
            "gateway ready",
            extra={"fields": {tier.value: list(pool.endpoints) for tier, pool in pools.items()}},
        )
        listener: MetricsListener | None = None
        if settings.gateway.metrics_port is not None:
            listener = MetricsListener(
                metrics.scrape,
                settings.gateway.metrics_host or settings.gateway.host,
                settings.gateway.metrics_port,
                reuse_port=metrics.multiprocess,
            )
        try:
            if listener is not None:
                await listener.start()
            yield
        finally:
            gc.set_threshold(*gc_thresholds)
            if isinstance(app, GatewayApp):
                app.hot_path = None
            if listener is not None:
                await listener.stop()
            ticking.cancel()
            if joining is not None:
                joining.cancel()
            for pool in pools.values():
                await pool.stop()
            upstream.close()
            await session.close()
            await gatekeeper.budgets.close()
            await limiter.close()
            if wiring is not None:
                wiring.close()
            if access_log is not None:
                access_log.flush()

    docs = settings.gateway.docs
    app = GatewayApp(
        title="tiergate",
        version=__version__,
        description="OpenAI-compatible gateway over a standard and a fast tier of vLLM.",
        lifespan=lifespan,
        docs_url="/docs" if docs else None,
        redoc_url="/redoc" if docs else None,
        openapi_url="/openapi.json" if docs else None,
    )
    app.add_middleware(BodyReadDeadline, seconds=settings.gateway.body_read_timeout_seconds)

    def openapi_with_served_models() -> dict[str, Any]:
        # The request schemas carry the models served right now as examples, so that the
        # description (and a fuzzer reading it) can reach the backends; only without keys,
        # when anyone may list the models anyway: the description is served to anyone.
        schema = FastAPI.openapi(app)
        state = built_gateway_state(app)
        names = (
            sorted({c["id"] for c in _model_cards(state)})
            if state is not None and not settings.auth.enabled
            else []
        )
        openapi.add_model_examples(schema, names)
        add_job_components(schema)
        add_batch_components(schema)
        return schema

    app.openapi = openapi_with_served_models  # type: ignore[method-assign]

    register_job_routes(app, lambda r: gateway_state(r).jobs, lambda r: gateway_state(r).batches)
    register_file_routes(app, lambda r: gateway_state(r).files)
    register_batch_routes(app, lambda r: gateway_state(r).openai_batches)
    register_ops_routes(app, settings)

    @app.exception_handler(OpenAIError)
    async def _openai_error(request: Request, exc: OpenAIError) -> Response:
        return exc.to_response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return OpenAIError(exc.status_code, str(exc.detail), code=code).to_response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return OpenAIError(400, str(first.get("msg", "invalid request")), param=param).to_response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error")
        return OpenAIError(500, "Internal gateway error.", code="internal_error").to_response()

    for route in ROUTES.values():
        _register_proxied(app, route, settings.gateway.max_tokens_limit)

    @app.get(
        "/v1/models",
        tags=["openai"],
        responses={
            200: openapi.json_response(openapi.MODEL_LIST, "Models"),
            **openapi.error_responses("401"),
        },
    )
    async def list_models(request: Request) -> Response:
        """Models served by any tier (that the key may use), each with the tiers serving it."""
        state = gateway_state(request)
        caller = state.gatekeeper.authenticate(request.headers.get("authorization"))
        cards = [c for c in _model_cards(state) if caller.may_use_model(c["id"])]
        return _json({"object": "list", "data": cards})

    @app.get(
        "/v1/models/{model_id:path}",
        tags=["openai"],
        responses={
            200: openapi.json_response(openapi.MODEL_CARD, "A model"),
            **openapi.error_responses("401", "404"),
        },
    )
    async def get_model(model_id: str, request: Request) -> Response:
        state = gateway_state(request)
        caller = state.gatekeeper.authenticate(request.headers.get("authorization"))
        for card in _model_cards(state):
            if not caller.may_use_model(card["id"]):
                continue
            if card["id"] == model_id:
                return _json(card)
        raise OpenAIError(
            404, f"The model {model_id!r} does not exist.", param="model", code="model_not_found"
        )

    @app.get(
        "/v1/tiers",
        tags=["tiergate"],
        responses={200: {"description": "What each tier runs and the evidence for it"}},
    )
    async def list_tiers(request: Request) -> Response:
        """What each tier runs, and for the fast tier the measured speedup, parity verdict,
        when and on what hardware it was decided."""
        state = gateway_state(request)
        state.gatekeeper.authenticate(request.headers.get("authorization"))
        return _json(state.evidence.describe())

    @app.get(
        "/v1/usage",
        tags=["tiergate"],
        responses={200: {"description": "The caller's spend budgets and what each has left"}},
    )
    async def usage(request: Request) -> Response:
        """The calling key's spend budgets and its team's (tokens, or dollars at each tier's
        price, per UTC day and month): limit, spent, left, and when each renews, with the
        prices where a budget is in dollars. Only the caller's own; empty when none is set
        (or keys are off)."""
        state = gateway_state(request)
        caller = state.gatekeeper.authenticate(request.headers.get("authorization"))
        book = state.gatekeeper.budgets
        budgets = await book.usage(caller)
        body: dict[str, Any] = {"object": "list", "key": caller.name, "data": budgets}
        if any(b["unit"] == "usd" for b in budgets):
            body["prices_per_million_tokens"] = {t.value: p for t, p in book.prices.items()}
        return _json(body)

    return app


def _register_proxied(app: FastAPI, route: Route, max_tokens_limit: int) -> None:
    """A proxied route, registered for the description and for what the hot path in
    :class:`GatewayApp` does not take (it serves matching POSTs itself)."""

    async def proxied(request: Request) -> Response:
        return await gateway_state(request).proxy.handle(request, route.path)

    proxied.__doc__ = (
        f"{route.summary}; ``service_tier`` or ``X-Tiergate-Tier`` picks the tier, as for chat."
    )
    app.post(
        route.path,
        tags=["openai"],
        name=route.path,
        **openapi.route_doc(route, max_tokens_limit),
    )(proxied)


def _model_cards(state: GatewayState) -> list[dict[str, Any]]:
    """OpenAI's model fields, plus which tiers serve the model (``tiers``) and what each of
    them runs with the evidence for it (``tier_details``: recipe, measured speedup, parity
    verdict, from the tuner's decision; ``GET /v1/tiers`` adds the hardware)."""
    runs = {
        entry["tier"]: {k: v for k, v in entry.items() if k != "hardware"}
        for entry in state.evidence.describe()["data"]
    }
    cards: dict[str, dict[str, Any]] = {}
    for tier, pool in state.pools.items():
        for name, card in pool.models().items():
            merged = cards.setdefault(
                name,
                {
                    "id": name,
                    "object": "model",
                    "created": card.get("created", 0),
                    "owned_by": "tiergate",
                    "max_model_len": card.get("max_model_len"),
                    "tiers": [],
                    "tier_details": [],
                },
            )
            merged["tiers"].append(tier.value)
            merged["tier_details"].append(runs.get(tier.value, {"tier": tier.value}))
    return sorted(cards.values(), key=lambda c: str(c["id"]))
