"""Opening an upstream request: endpoint choice, retries, passive ejection, tier fallback.

Everything here happens before the first byte reaches the client, which is what makes a
retry or a change of tier safe. Errors are translated into :class:`OpenAIError` here, at
the one place where upstream I/O starts.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from tiergate.backends.endpoint import Endpoint
from tiergate.backends.pool import TierPool
from tiergate.gateway.access.policy import TierChoice
from tiergate.gateway.errors import OpenAIError, from_upstream
from tiergate.gateway.metrics import GatewayMetrics
from tiergate.gateway.openai.selection import InspectedRequest
from tiergate.gateway.openai.upstreamhttp import Origin, UpstreamClient, UpstreamResponse
from tiergate.settings import PolicySettings, TimeoutSettings
from tiergate.tiers import Tier

log = logging.getLogger("tiergate.upstream")

RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})


@dataclass(slots=True)
class Opened:
    """An upstream response whose status line and headers have arrived."""

    response: UpstreamResponse
    endpoint: Endpoint
    tier: Tier
    fallback: bool
    attempts: int
    _released: bool = field(default=False)

    def release(self) -> None:
        """Close the upstream response (a cut connection aborts vLLM's request) once."""
        if not self._released:
            self._released = True
            self.endpoint.in_flight -= 1
            self.response.close()


class UpstreamCaller:
    """Opens a request on the best endpoint of a tier, retrying and falling back."""

    def __init__(
        self,
        pools: dict[Tier, TierPool],
        client: UpstreamClient,
        timeouts: TimeoutSettings,
        policy: PolicySettings,
        metrics: GatewayMetrics,
    ) -> None:
        self._pools = pools
        self._client = client
        # Parsed once per endpoint rather than on every request.
        self._origins: dict[str, Origin] = {}
        self._policy = policy
        self._metrics = metrics
        self._connect_timeout = timeouts.connect_seconds
        # Each wait for the server, the first byte's included (aiohttp's sock_read).
        self._read_timeout = timeouts.first_byte_seconds

    async def open(
        self,
        req: InspectedRequest,
        decision: TierChoice,
        body: bytes,
        request_id: str,
        long_prompt: bool = False,
    ) -> Opened:
        """Open the request on the decision's tier, or its fallback (the policy's choice)."""
        headers = {"content-type": "application/json", "x-request-id": request_id}
        path = req.route.path
        last_error: OpenAIError | None = None
        attempts = 0
        tiers = decision.tiers
        for index, tier in enumerate(tiers):
            if index > 0:
                reason = "timeout" if last_error and last_error.status == 504 else "unavailable"
                self._metrics.fallbacks.labels(tiers[0].value, tier.value, reason).inc()
                log.warning(
                    "falling back from %s to %s: %s",
                    tiers[0].value,
                    tier.value,
                    last_error.message if last_error else reason,
                )
            tried: list[str] = []
            for _ in range(self._policy.max_attempts):
                ep = self._pools[tier].choose(
                    req.model, req.prefix_key, exclude=tried, long_prompt=long_prompt
                )
                if ep is None:
                    break
                if tried:
                    self._metrics.retries.labels(tier.value, _reason(last_error)).inc()
                tried.append(ep.url)
                attempts += 1
                outcome = await self._attempt(
                    ep, path, body, {**headers, **self._pools[tier].auth_headers}
                )
                if isinstance(outcome, UpstreamResponse):
                    return Opened(outcome, ep, tier, index > 0, attempts)
                last_error = outcome
        if last_error is not None:
            raise last_error
        raise OpenAIError(
            503,
            f"No healthy endpoint is serving model {req.model!r} on tier "
            f"{' or '.join(t.value for t in tiers)}.",
            code="no_healthy_endpoint",
            headers={"retry-after": "1"},
        )

    async def _attempt(
        self, ep: Endpoint, path: str, body: bytes, headers: dict[str, str]
    ) -> UpstreamResponse | OpenAIError:
        ep.in_flight += 1
        try:
            origin = self._origins.get(ep.url)
            if origin is None:
                if len(self._origins) > 4096:  # endpoints come and go with DNS
                    self._origins.clear()
                origin = self._origins[ep.url] = Origin.parse(ep.url)
            resp = await self._client.post(
                origin,
                path,
                body,
                headers,
                connect_timeout=self._connect_timeout,
                read_timeout=self._read_timeout,
            )
        except asyncio.CancelledError:
            ep.in_flight -= 1
            raise
        except TimeoutError:
            ep.in_flight -= 1
            self._failed(ep)
            return OpenAIError(
                504, f"The {ep.tier.value} tier did not answer in time.", code="upstream_timeout"
            )
        except OSError as exc:
            ep.in_flight -= 1
            self._failed(ep)
            return OpenAIError(
                503,
                f"The {ep.tier.value} tier is unavailable ({type(exc).__name__}).",
                code="backend_unavailable",
                headers={"retry-after": "1"},
            )
        if resp.status == 401:
            # vLLM refused the engine key (tiers.<tier>.api_key), not the client's: the
            # client must not read this as its own key being wrong.
            ep.in_flight -= 1
            resp.close()
            log.warning("endpoint %s refused the gateway's engine API key", ep.url)
            return OpenAIError(
                502,
                f"The {ep.tier.value} tier refused the gateway's credentials.",
                code="upstream_auth_failed",
            )
        if resp.status in RETRYABLE_STATUS:
            try:
                raw = await resp.read()
            except OSError:  # TimeoutError too
                raw = b""
            finally:
                ep.in_flight -= 1
                resp.close()
            if resp.status != 429:
                self._failed(ep)
            return from_upstream(resp.status, raw)
        ep.record_success()
        return resp

    def _failed(self, ep: Endpoint) -> None:
        if ep.record_failure():
            self._metrics.ejections.labels(ep.tier.value).inc()
            log.warning("endpoint %s ejected after %d failures", ep.url, ep.consecutive_failures)


def _reason(error: OpenAIError | None) -> str:
    if error is None:
        return "unknown"
    return error.code or str(error.status)
