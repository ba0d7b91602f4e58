"""One vLLM server as the gateway sees it: health, ejection, load, models."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tiergate.tiers import Tier


@dataclass(slots=True)
class LoadSignals:
    """vLLM's own load gauges, scraped from ``/metrics`` (summed over models)."""

    running: float = 0.0
    waiting: float = 0.0
    kv_cache_usage: float = 0.0


@dataclass(slots=True)
class Endpoint:
    """Mutable state of one upstream server; owned by its pool, touched only on the event loop."""

    url: str
    tier: Tier
    eject_after_failures: int = 3
    cooldown_seconds: float = 10.0
    healthy: bool = True
    consecutive_failures: int = 0
    ejected_until: float = 0.0
    in_flight: int = 0
    load: LoadSignals = field(default_factory=LoadSignals)
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The POST routes its engine serves (vLLM registers routes by the model's task), from
    # its /openapi.json; None until it has answered.
    routes: frozenset[str] | None = None
    # The description was asked for and answered (with or without routes): not asked again
    # until the engine has been unhealthy (restarted, perhaps with another model).
    routes_asked: bool = False
    from_discovery: bool = False

    def available(self, now: float | None = None) -> bool:
        """Healthy by the last active check and not inside a passive-ejection cool-down."""
        now = time.monotonic() if now is None else now
        return self.healthy and now >= self.ejected_until

    def serves(self, model: str) -> bool:
        # Before the first successful /v1/models answer the endpoint is assumed to serve
        # everything: the request then fails loudly instead of being routed nowhere.
        return not self.models or model in self.models

    def score(self) -> float:
        """Lower is better. Our own in-flight count is fresh; the scraped gauges also see
        other gateway replicas' requests, so the larger of the two counts the running ones."""
        return (
            max(float(self.in_flight), self.load.running)
            + self.load.waiting
            + 4.0 * self.load.kv_cache_usage
        )

    def record_success(self) -> None:
        self.consecutive_failures = 0

    def record_failure(self) -> bool:
        """Count a failed call; returns True when this failure ejects the endpoint."""
        self.consecutive_failures += 1
        if self.consecutive_failures >= self.eject_after_failures:
            self.ejected_until = time.monotonic() + self.cooldown_seconds
            return True
        return False
