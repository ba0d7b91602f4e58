"""A tier's pool of endpoints: static and DNS-discovered members, health checks, choice."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any

import aiohttp

from tiergate.backends.endpoint import Endpoint
from tiergate.backends.loadstats import parse_load_signals
from tiergate.backends.routing import LoadAwareRouter, PrefixAffinity
from tiergate.settings import HealthSettings, PoolSettings, RoutingSettings
from tiergate.tiers import Tier

log = logging.getLogger("tiergate.pool")


class TierPool:
    """The endpoints serving one tier, kept fresh by background health and discovery tasks."""

    def __init__(
        self,
        tier: Tier,
        settings: PoolSettings,
        health: HealthSettings,
        routing: RoutingSettings,
        session: aiohttp.ClientSession,
    ) -> None:
        self.tier = tier
        self._settings = settings
        self._health = health
        self._session = session
        self.router = LoadAwareRouter(
            PrefixAffinity(routing.affinity_max_entries), routing.affinity_load_slack
        )
        self.endpoints: dict[str, Endpoint] = {}
        # Sent on every request to this tier's servers (completions and probes alike).
        self.auth_headers: dict[str, str] = (
            {"authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
        )
        self.model_names: frozenset[str] = frozenset()
        self._tasks: list[asyncio.Task[None]] = []
        # Endpoints designated for long prompts serve only those, so that a flood of long
        # prompts cannot occupy the engines that short requests need.
        self.long_context = frozenset(settings.long_context_endpoints)
        for url in [*settings.endpoints, *settings.long_context_endpoints]:
            self._add(url, from_discovery=False)

    def _add(self, url: str, *, from_discovery: bool) -> None:
        if url not in self.endpoints:
            self.endpoints[url] = Endpoint(
                url=url,
                tier=self.tier,
                eject_after_failures=self._health.eject_after_failures,
                cooldown_seconds=self._health.cooldown_seconds,
                from_discovery=from_discovery,
            )

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Run one discovery and health round, then keep them running in the background."""
        if self._settings.dns is not None:
            await self.refresh_dns()
            self._tasks.append(asyncio.create_task(self._dns_loop()))
        await self.check_all()
        self._tasks.append(asyncio.create_task(self._health_loop()))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    # -- choice ----------------------------------------------------------------------------

    def candidates(
        self, model: str, exclude: Iterable[str] = (), long_prompt: bool = False
    ) -> list[Endpoint]:
        now = time.monotonic()
        skip = set(exclude)
        found = [
            ep
            for ep in self.endpoints.values()
            if ep.url not in skip and ep.available(now) and ep.serves(model)
        ]
        if self.long_context:
            lane = [ep for ep in found if (ep.url in self.long_context) == long_prompt]
            # A lane with no available endpoint borrows the other lane's rather than fail.
            return lane or found
        return found

    def choose(
        self,
        model: str,
        prefix_key: int | None,
        exclude: Iterable[str] = (),
        long_prompt: bool = False,
    ) -> Endpoint | None:
        found = self.candidates(model, exclude, long_prompt)
        return self.router.choose(found, prefix_key) if found else None

    def has_available(self) -> bool:
        now = time.monotonic()
        return any(ep.available(now) for ep in self.endpoints.values())

    def serves_route(self, path: str) -> bool | None:
        """Whether this tier's engines serve a route: None while none has said."""
        said = False
        for ep in self.endpoints.values():
            if ep.routes is not None:
                if path in ep.routes:
                    return True
                said = True
        return False if said else None

    def models(self) -> dict[str, dict[str, Any]]:
        cards: dict[str, dict[str, Any]] = {}
        for ep in self.endpoints.values():
            cards.update(ep.models)
        return cards

    async def set_endpoints(self, urls: list[str]) -> None:
        """Serve the static endpoints ``urls`` from now on (the local stack's fast tier
        joining, tiergate.fitting): each new one is health-checked (and its models and
        routes read) before it can be chosen; static ones no longer listed are dropped
        (a request in flight keeps the endpoint it holds). DNS-discovered and long-context
        members stay as they are."""
        fresh = [
            Endpoint(
                url=url,
                tier=self.tier,
                eject_after_failures=self._health.eject_after_failures,
                cooldown_seconds=self._health.cooldown_seconds,
                from_discovery=False,
            )
            for url in dict.fromkeys(urls)
            if url not in self.endpoints
        ]
        await asyncio.gather(*(self.check(ep) for ep in fresh))
        for ep in fresh:
            self.endpoints[ep.url] = ep
        kept = set(urls) | self.long_context
        for url in [
            u for u, ep in self.endpoints.items() if not ep.from_discovery and u not in kept
        ]:
            del self.endpoints[url]
            self.router.affinity.forget(url)
        self._refresh_model_names()

    # -- discovery ---------------------------------------------------------------------------

    async def refresh_dns(self) -> None:
        dns = self._settings.dns
        assert dns is not None
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(dns.name, dns.port, type=socket.SOCK_STREAM)
        except OSError as exc:
            # Keep the last known members: a DNS blip must not empty a healthy pool.
            log.warning("dns discovery failed for %s: %s", dns.name, exc)
            return
        found = set()
        for _family, _type, _proto, _canon, addr in infos:
            host = str(addr[0])
            host = f"[{host}]" if ":" in host else host
            found.add(f"{dns.scheme}://{host}:{dns.port}")
        for url in found:
            self._add(url, from_discovery=True)
        for url in [u for u, ep in self.endpoints.items() if ep.from_discovery and u not in found]:
            del self.endpoints[url]
            self.router.affinity.forget(url)
        self._refresh_model_names()

    def _refresh_model_names(self) -> None:
        # Kept as a set so that the request path checks a model name in O(1).
        self.model_names = frozenset(name for ep in self.endpoints.values() for name in ep.models)

    async def _dns_loop(self) -> None:
        assert self._settings.dns is not None
        while True:
            await asyncio.sleep(self._settings.dns.refresh_seconds)
            await self.refresh_dns()

    # -- health ------------------------------------------------------------------------------

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self._health.interval_seconds)
            await self.check_all()

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(ep) for ep in list(self.endpoints.values())))

    async def check(self, ep: Endpoint) -> None:
        """Active check: ``/health`` decides health; ``/metrics`` and ``/v1/models`` refresh
        the load signals and the model list when the endpoint answers."""
        was_healthy = ep.healthy
        try:
            async with self._get(ep, "/health") as resp:
                ep.healthy = resp.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            ep.healthy = False
        if ep.healthy:
            probes = [self._scrape_load(ep), self._fetch_models(ep)]
            if not ep.routes_asked:
                probes.append(self._fetch_routes(ep))
            await asyncio.gather(*probes)
        else:
            ep.routes, ep.routes_asked = None, False  # a restarted engine may serve another task
        if was_healthy != ep.healthy:
            log.warning(
                "endpoint %s (%s) is now %s",
                ep.url,
                self.tier.value,
                "healthy" if ep.healthy else "unhealthy",
            )

    def _get(
        self, ep: Endpoint, path: str, timeout_s: float | None = None
    ) -> AbstractAsyncContextManager[aiohttp.ClientResponse]:
        timeout = aiohttp.ClientTimeout(total=timeout_s or self._health.timeout_seconds)
        return self._session.get(f"{ep.url}{path}", timeout=timeout, headers=self.auth_headers)

    async def _scrape_load(self, ep: Endpoint) -> None:
        try:
            async with self._get(ep, "/metrics") as resp:
                if resp.status == 200:
                    ep.load = parse_load_signals(await resp.text())
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            log.debug("metrics scrape of %s failed: %s", ep.url, exc)

    async def _fetch_routes(self, ep: Endpoint) -> None:
        # Once per engine start: vLLM's description lists the routes it registered.
        try:
            async with self._get(
                ep, "/openapi.json", max(self._health.timeout_seconds, 5.0)
            ) as resp:
                ep.routes_asked = True
                paths = (await resp.json()).get("paths") if resp.status == 200 else None
                # Only a description that lists routes says anything about them: a server
                # answering every path alike (or none) leaves them unknown, hence assumed.
                if isinstance(paths, dict) and paths:
                    ep.routes = frozenset(p for p, ops in paths.items() if "post" in ops)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError, AttributeError) as exc:
            log.debug("route list of %s failed: %s", ep.url, exc)

    async def _fetch_models(self, ep: Endpoint) -> None:
        try:
            async with self._get(ep, "/v1/models") as resp:
                if resp.status == 200:
                    body = await resp.json()
                    ep.models = {m["id"]: m for m in body.get("data", []) if "id" in m}
                    self._refresh_model_names()
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError, KeyError) as exc:
            log.debug("model list of %s failed: %s", ep.url, exc)
