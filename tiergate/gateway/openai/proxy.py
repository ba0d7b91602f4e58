"""The handler of every proxied route: inspect, decide the tier, open upstream, answer or
relay. Routes differ only as their :class:`~tiergate.gateway.openai.routes.Route` says."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from tiergate.backends.pool import TierPool
from tiergate.gateway.access.auth import ON_BEHALF_OF
from tiergate.gateway.access.cachesalt import CacheSalts
from tiergate.gateway.access.gatekeeper import Gatekeeper, Lease
from tiergate.gateway.errors import OpenAIError, from_upstream
from tiergate.gateway.logs import AccessLog
from tiergate.gateway.metrics import GatewayMetrics
from tiergate.gateway.openai.assemble import Assembled, read_assembled
from tiergate.gateway.openai.clientwatch import ClientGone, DisconnectWatch
from tiergate.gateway.openai.relay import BodyRelay, RelayResponse
from tiergate.gateway.openai.requestids import (
    INTERNAL_ID_HEADER,
    REQUEST_ID_HEADER,
    RequestIds,
    client_request_id,
)
from tiergate.gateway.openai.routes import ROUTES, StreamEnd, echo_tier
from tiergate.gateway.openai.selection import (
    TIER_HEADER,
    InspectedRequest,
    inspect,
    receive_body,
    upstream_body,
)
from tiergate.gateway.openai.streaming import (
    ChunkRewriter,
    EventStreamResponse,
    ResponseEventRewriter,
    StreamOutcome,
    relay_events,
)
from tiergate.gateway.openai.timing import answer_times, choices_of
from tiergate.gateway.openai.upstream import Opened, UpstreamCaller
from tiergate.gateway.openai.upstreamhttp import UpstreamClient
from tiergate.gateway.openai.wire import JSONAnswer, wanted_headers
from tiergate.settings import Settings
from tiergate.tiers import Tier

OVERHEAD_HEADER = "x-tiergate-overhead-ms"

# A non-streamed answer the gateway does not rewrite (no `service_tier` to echo) is passed
# through as it arrives above this size (or of no declared size), rather than held whole.
_RELAY_ABOVE_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class RequestContext:
    """What the helpers that answer one proxied request share, built once, when the
    request goes upstream (the only allocation it adds: the hot path's budget is about
    0.1 ms). ``headers`` (the response's) and ``fields`` (the access-log line) are the
    request's own dicts, still filled in as the answer becomes known."""

    path: str
    req: InspectedRequest
    lease: Lease
    watch: DisconnectWatch
    headers: dict[str, str]
    fields: dict[str, Any]
    # time.perf_counter() when the request arrived and when its upstream call began.
    started: float
    upstream_started: float

    def gateway_seconds(self) -> float:
        """The gateway's own time before the upstream call."""
        return self.upstream_started - self.started


class CompletionsProxy:
    """Serves every route of :data:`~tiergate.gateway.openai.routes.ROUTES` over the tier pools."""

    def __init__(
        self,
        settings: Settings,
        pools: dict[Tier, TierPool],
        upstream: UpstreamClient,
        metrics: GatewayMetrics,
        gatekeeper: Gatekeeper,
        access_log: AccessLog | None,
    ) -> None:
        self._settings = settings
        self._gatekeeper = gatekeeper
        self._access_log = access_log
        self._metrics = metrics
        self._ids = RequestIds()
        self._salts = CacheSalts(settings.routing.cache_salt_secret)
        self._caller = UpstreamCaller(pools, upstream, settings.timeouts, settings.policy, metrics)

    async def handle(self, request: Request, path: str) -> Response:
        watch = DisconnectWatch(request)
        response: Response | None = None
        lease: Lease | None = None
        try:
            response, lease = await self._handle(request, path, watch)
            return response
        finally:
            watch.close()
            # A relay's lease ends with the relay; every other one ends here at the latest.
            if lease is not None and not isinstance(response, RelayResponse):
                lease.end(None)

    async def _handle(
        self, request: Request, path: str, watch: DisconnectWatch
    ) -> tuple[Response, Lease | None]:
        started = time.perf_counter()
        # The lease and vLLM get the gateway's own id; the client's is only echoed/logged.
        request_id = self._ids.next()
        # The headers the gateway reads, in one pass over the raw list (Headers.get
        # scans and decodes the list on every call).
        wanted = wanted_headers(request.scope["headers"])
        client_id = client_request_id(wanted.get(REQUEST_ID_HEADER))
        headers = {REQUEST_ID_HEADER: client_id or request_id, INTERNAL_ID_HEADER: request_id}
        fields: dict[str, Any] = {"request_id": request_id, "path": path}
        if client_id is not None:
            fields["client_request_id"] = client_id
        lease: Lease | None = None
        try:
            caller = self._gatekeeper.authenticate(
                wanted.get("authorization"), wanted.get(ON_BEHALF_OF)
            )
            fields["key"] = caller.name
            raw = await receive_body(
                request.receive, wanted.get("content-length"), self._settings.gateway.max_body_bytes
            )
            req = inspect(
                raw,
                wanted.get(TIER_HEADER),
                self._settings.routing.prefix_chars,
                self._settings.gateway.max_tokens_limit,
                ROUTES[path],
                self._salts.of(caller.owner),
            )
            fields.update(model=req.model, stream=req.stream)
            decision = self._gatekeeper.decide(caller, req)
            # Tier and Reason are StrEnums: their members are the strings (``.value`` is a
            # descriptor call, and the hot path would make six).
            fields.update(tier_requested=decision.tier, tier_reason=decision.reason)
            lease = await watch.race(self._gatekeeper.admit(caller, req, decision, request_id))
            if lease.choice is not decision:  # the asked tier's admission was busy
                decision = lease.choice
                fields["tier_reason"] = decision.reason
            headers.update(lease.headers)
            long_prompt = self._gatekeeper.admission.is_long(lease.estimate)
            body = upstream_body(
                req, decision.urgency if self._settings.policy.engine_priorities else None
            )
            ctx = RequestContext(
                path, req, lease, watch, headers, fields, started, time.perf_counter()
            )
            opened = await watch.race(
                self._caller.open(req, decision, body, request_id, long_prompt)
            )
        except OpenAIError as err:
            if lease is not None:
                lease.refuse()  # no engine answered: its budget charge is given back
            return self._refuse(err, path, started, headers, fields), lease
        except (ClientGone, ClientDisconnect):
            if lease is not None:
                lease.refuse()
            self._metrics.client_disconnects.labels("none").inc()
            return Response(status_code=499), lease
        lease.answered_on = opened.tier
        headers.update(
            {
                "x-tiergate-tier": opened.tier,
                "x-tiergate-tier-reason": "fallback" if opened.fallback else decision.reason,
                OVERHEAD_HEADER: f"{ctx.gateway_seconds() * 1000.0:.3f}",
            }
        )
        if opened.fallback:
            headers["x-tiergate-fallback"] = "true"
        fields.update(
            tier=opened.tier,
            endpoint=opened.endpoint.url,
            attempts=opened.attempts,
            fallback=opened.fallback,
        )
        if opened.response.status != 200:
            return await self._upstream_error(ctx, opened), lease
        if req.stream:
            watch.close()  # the streaming response watches for the disconnect from here on
            return self._stream(ctx, opened), lease
        return await self._complete(ctx, opened), lease

    # -- non-streaming ---------------------------------------------------------------------

    async def _complete(self, ctx: RequestContext, opened: Opened) -> Response:
        tier = opened.tier
        req = ctx.req
        if not req.route.echoes_tier:
            length = opened.response.length
            if length is None or length > _RELAY_ABOVE_BYTES:
                return self._relay_body(ctx, opened)
        data: Any = None
        assembling = 0.0
        times: Assembled | None = None
        # An engine that answers a stream request with a plain body (one that ignores
        # `stream`, a static stand-in) is read as a plain answer.
        assembled = req.assembled and _is_event_stream(opened.response.headers)
        try:
            if assembled:
                chat = req.route.path == "/v1/chat/completions"
                assembly = read_assembled(opened.response, self._settings.timeouts, req.body, chat)
                times = await ctx.watch.race(assembly)
                data, assembling = times.answer, times.spent
                raw = b""
            else:
                raw = await ctx.watch.race(opened.response.read())
        except (ClientGone, ClientDisconnect):
            opened.release()
            self._metrics.client_disconnects.labels(tier.value).inc()
            self._finish(ctx.fields, ctx.started, ctx.path, tier, req.model, 499, overhead=None)
            return Response(status_code=499)
        except OSError as exc:  # TimeoutError too
            opened.release()
            opened.endpoint.record_failure()
            err = OpenAIError(
                504 if isinstance(exc, TimeoutError) else 502,
                f"The {tier.value} tier failed while answering ({type(exc).__name__}).",
                code="upstream_timeout" if isinstance(exc, TimeoutError) else "upstream_error",
            )
            return self._refuse(err, ctx.path, ctx.started, ctx.headers, ctx.fields, tier)
        except OpenAIError as err:  # an error event in an assembled stream
            opened.release()
            return self._refuse(err, ctx.path, ctx.started, ctx.headers, ctx.fields, tier)
        opened.release()
        received = time.perf_counter()
        if not assembled:
            try:
                data = orjson.loads(raw)
            except orjson.JSONDecodeError:
                data = None
        if isinstance(data, dict):
            if req.route.echoes_tier:
                echo_tier(data, tier, ctx.lease.choice.flex)
            usage = data.get("usage")
            if isinstance(usage, dict):
                self._count_tokens(tier, req.model, usage)
                ctx.lease.end(usage)
                if times is not None:  # read from the engine's stream: timed as one
                    timed = (ctx.started, times.first_token_at, times.ended_at)
                    n = choices_of(req.body)
                    answer_times(self._metrics, ctx.fields, ctx.lease, tier, timed, usage, None, n)
            raw = orjson.dumps(data)
        overhead = ctx.gateway_seconds() + assembling + (time.perf_counter() - received)
        ctx.headers[OVERHEAD_HEADER] = f"{overhead * 1000.0:.3f}"

        def finish() -> None:  # once the answer is on its way (its latency includes that)
            self._finish(ctx.fields, ctx.started, ctx.path, tier, req.model, 200, overhead=overhead)

        return JSONAnswer(raw, ctx.headers, finish)

    def _relay_body(self, ctx: RequestContext, opened: Opened) -> Response:
        """A large answer that the gateway need not rewrite goes through as it arrives."""
        tier = opened.tier
        relay = BodyRelay(opened)
        ctx.headers[OVERHEAD_HEADER] = f"{ctx.gateway_seconds() * 1000.0:.3f}"
        length = opened.response.length
        if length is not None:
            ctx.headers["content-length"] = str(length)

        def finish(error: str | None) -> None:
            opened.release()
            usage = relay.usage()
            ctx.lease.end(usage)
            if usage is not None:
                self._count_tokens(tier, ctx.req.model, usage)
            if error is not None:
                ctx.fields["relay_error"] = error
            status = 200 if relay.complete else 502 if relay.broken else 499
            if status == 499:
                self._metrics.client_disconnects.labels(tier.value).inc()
            self._finish(
                ctx.fields,
                ctx.started,
                ctx.path,
                tier,
                ctx.req.model,
                status,
                overhead=ctx.gateway_seconds(),
            )

        content_type = opened.response.headers.get("content-type", "application/json")
        return RelayResponse(
            relay.body(),
            finish,
            self._settings.timeouts.client_write_seconds,
            headers=ctx.headers,
            media_type=content_type,
        )

    # -- streaming -------------------------------------------------------------------------

    def _stream(self, ctx: RequestContext, opened: Opened) -> Response:
        tier = opened.tier
        req = ctx.req
        fields = ctx.fields
        outcome = StreamOutcome()
        finished = False

        def finish(result: StreamOutcome) -> None:
            nonlocal finished
            if finished:
                return
            finished = True
            opened.release()
            ctx.lease.end(result.usage or self._relayed_usage(ctx, result))
            if result.error is not None:
                self._metrics.stream_errors.labels(tier.value, result.error).inc()
                fields["stream_error"] = result.error
            elif not result.completed:
                result.cancelled = True
                self._metrics.client_disconnects.labels(tier.value).inc()
            end = time.perf_counter()
            if result.usage:
                self._count_tokens(tier, req.model, result.usage)
            if result.first_token_at is not None:
                timed = (ctx.started, result.first_token_at, end)
                n = choices_of(req.body)
                answer_times(self._metrics, fields, ctx.lease, tier, timed, result.usage, result, n)
            status = 499 if result.cancelled else 200
            overhead = ctx.gateway_seconds() + result.processing_seconds
            self._finish(
                fields,
                ctx.started,
                ctx.path,
                tier,
                req.model,
                status,
                overhead=overhead,
                stream=True,
            )

        rewrite = (
            ResponseEventRewriter(tier, outcome, ctx.lease.choice.flex)
            if req.route.stream_end is StreamEnd.RESPONSE
            else ChunkRewriter(tier, req.wants_usage, outcome, ctx.lease.choice.flex)
        )
        body = relay_events(
            opened,
            rewrite,
            self._settings.timeouts.between_chunks_seconds,
            outcome,
            finish,
        )
        ctx.headers.update({"cache-control": "no-cache", "x-accel-buffering": "no"})

        def cleanup(error: str | None) -> None:
            if error is not None and outcome.error is None and not finished:
                outcome.error = error
            finish(outcome)

        return EventStreamResponse(
            body,
            cleanup,
            self._settings.timeouts.client_write_seconds,
            outcome,
            headers=ctx.headers,
        )

    # -- helpers ---------------------------------------------------------------------------

    async def _upstream_error(self, ctx: RequestContext, opened: Opened) -> Response:
        ctx.lease.refuse()  # the engine refused it: nothing to charge to a budget
        try:
            raw = await opened.response.read()
        except OSError:  # TimeoutError too
            raw = b""
        finally:
            opened.release()
        if opened.response.status in (404, 405) and _framework_not_found(raw):
            # The engine has no such route (vLLM registers routes by the model's task):
            # said plainly, not as the engine framework's bare "Not Found".
            err = OpenAIError(
                404,
                f"The {opened.tier.value} tier's engine does not serve {ctx.path}.",
                code="route_not_served",
            )
        else:
            err = from_upstream(opened.response.status, raw)
        return self._refuse(
            err, ctx.path, ctx.started, ctx.headers, ctx.fields, opened.tier, ctx.req.model
        )

    def _refuse(
        self,
        err: OpenAIError,
        path: str,
        started: float,
        headers: dict[str, str],
        fields: dict[str, Any],
        tier: Tier | None = None,
        model: str | None = None,
    ) -> Response:
        # Also before a RequestContext exists (refused before going upstream): hence the
        # request's parts one by one.
        fields["error"] = err.code or err.type
        self._finish(
            fields, started, path, tier, model or fields.get("model"), err.status, overhead=None
        )
        return err.to_response(headers)

    def _relayed_usage(self, ctx: RequestContext, result: StreamOutcome) -> dict[str, Any]:
        """What a stream that ended without usage is charged: the prompt's estimate and the
        text relayed so far, in the same characters-per-token estimate."""
        per_token = self._settings.limits.chars_per_token
        completion = math.ceil(result.relayed_chars / per_token)
        prompt = ctx.lease.estimate
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def _count_tokens(self, tier: Tier, model: str, usage: dict[str, Any]) -> None:
        # Chat, completions and pooling routes say prompt/completion; responses input/output.
        prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
        completion = usage.get("completion_tokens", usage.get("output_tokens"))
        m = self._metrics
        if isinstance(prompt, int):
            m.count(m.prompt_tokens, tier, model, amount=prompt)
        if isinstance(completion, int):
            m.count(m.completion_tokens, tier, model, amount=completion)

    def _finish(
        self,
        fields: dict[str, Any],
        started: float,
        path: str,
        tier: Tier | None,
        model: str | None,
        status: int,
        *,
        overhead: float | None,
        stream: bool = False,
    ) -> None:
        elapsed = time.perf_counter() - started
        tier_label = tier if tier is not None else "none"
        # Only validated model names become label values, so the label set stays bounded.
        model_label = (
            model if model is not None and self._gatekeeper.models.serves(model) else "unknown"
        )
        m = self._metrics
        m.count(m.requests, tier_label, model_label, path, str(status))
        if tier is not None and status < 400:
            m.observe(m.latency, elapsed, tier_label)
        if overhead is not None:
            m.observe(m.overhead, overhead, "true" if stream else "false")
            fields["overhead_ms"] = round(overhead * 1000.0, 3)
        if self._access_log is not None:
            fields.update(status=status, latency_ms=round(elapsed * 1000.0, 3))
            self._access_log.write(fields)


def _is_event_stream(headers: dict[str, str]) -> bool:
    return headers.get("content-type", "").startswith("text/event-stream")


def _framework_not_found(raw: bytes) -> bool:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    return isinstance(body, dict) and body.get("detail") in ("Not Found", "Method Not Allowed")
