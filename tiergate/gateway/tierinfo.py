"""What each tier runs and the evidence for it, for callers (``GET /v1/tiers``) and
operators (``/metrics``): read from the tuner's decision file, re-read when it changes."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tiergate.evidence import TierDecision
from tiergate.fitting import Fitting
from tiergate.tiers import DEFAULT_URGENCY, FLEX_URGENCY, JOB_URGENCY, PRIORITY_URGENCY, Tier


class TierEvidence:
    """The decision at ``path`` (``None``: the tiers run what they were configured with)."""

    def __init__(
        self,
        path: str | None,
        engine_priorities: bool = False,
        shared_engines: bool = False,
        engine_modes: Mapping[Tier, str] | None = None,
        engine_count: int = 2,
        fitting: Fitting | None = None,
    ) -> None:
        self._path = Path(path) if path else None
        # The local stack's fast tier while it is fitted beside the serving gateway: no
        # decision is shown until it has joined (a stored one may be another machine's).
        self._fitting = fitting
        self._engine_priorities = engine_priorities
        # Both tiers' pools list the same engines (tuning.share_engines_when_equal).
        self._shared = shared_engines
        self._modes = dict(engine_modes or {})
        self._engine_count = engine_count
        self._stamp: tuple[int, int] | None = None
        self._decision: TierDecision | None = None

    def decision(self) -> TierDecision | None:
        if self._path is None or (self._fitting is not None and self._fitting.joined is None):
            return None
        try:
            stat = os.stat(self._path)
        except OSError:
            self._stamp, self._decision = None, None
            return None
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp != self._stamp:
            self._stamp, self._decision = stamp, TierDecision.load(self._path)
        return self._decision

    def describe(self) -> dict[str, Any]:
        """The body of ``GET /v1/tiers``."""
        decision = self.decision()
        standard: dict[str, Any] = {
            "tier": Tier.STANDARD.value,
            "service_tier": Tier.STANDARD.openai_name,
            "runs": "the reference weights, as configured",
        }
        fast: dict[str, Any] = {
            "tier": Tier.FAST.value,
            "service_tier": Tier.FAST.openai_name,
        }
        scheduling = self.scheduling()
        shared, count, modes = self._shared, self._engine_count, self._modes
        joined = self._fitting.joined if self._fitting is not None else None
        if joined is not None:
            shared, count = joined.shared_engines, joined.engine_count
            modes = {**modes, **joined.engine_modes}
        engines = (
            "its own"
            if not shared
            else "one engine, shared by both tiers"
            if count == 1
            else "shared by both tiers"
        )
        standard["engines"] = fast["engines"] = engines
        for tier, body in ((Tier.STANDARD, standard), (Tier.FAST, fast)):
            if tier in modes:
                body["engine_mode"] = modes[tier]
        if self._fitting is not None and joined is None:
            fast.pop("engine_mode", None)
            fast["engines"] = "none yet: the standard tier serves its requests meanwhile"
            fast["runs"] = "not yet: being fitted to this machine"
            fast["fitting"] = self._fitting.describe()
            return {
                "object": "list",
                "data": [standard, fast],
                "decision": None,
                "scheduling": scheduling,
            }
        if decision is None:
            fast["runs"] = "as configured (no tuner decision is published by this gateway)"
            return {
                "object": "list",
                "data": [standard, fast],
                "decision": None,
                "scheduling": scheduling,
            }
        chosen = decision.chosen
        fast.update(
            {
                "runs": decision.recipe_name,
                "recipe": chosen.model_dump(mode="json") if chosen else None,
                "verdict": decision.verdict,
                "reason": decision.reason,
                "speedup": decision.speedup,
                "parity": next(
                    (
                        c.parity.model_dump(mode="json")
                        for c in decision.candidates
                        if c.status == "chosen" and c.parity is not None
                    ),
                    None,
                ),
                "decided_at": int(decision.decided_at),
                "hardware": decision.fingerprint,
            }
        )
        return {
            "object": "list",
            "data": [standard, fast],
            "decision": decision.public(),
            "scheduling": scheduling,
        }

    def scheduling(self) -> dict[str, Any]:
        """Who goes first where requests share a queue (tiergate.tiers): in each tier's
        admission queue always; in the engines' own queues with engine priorities."""
        return {
            "engine_priorities": self._engine_priorities,
            "urgency": {
                "priority": PRIORITY_URGENCY,
                "default": DEFAULT_URGENCY,
                "flex": FLEX_URGENCY,
                "agent_jobs": JOB_URGENCY,
            },
            "order": "lower urgency first; then the key's priority",
        }


class TierEvidenceCollector(Collector):
    """``tiergate_tier_recipe_info`` and ``tiergate_tier_speedup`` at scrape time."""

    def __init__(self, evidence: TierEvidence) -> None:
        self._evidence = evidence

    def collect(self) -> Iterator[Metric]:
        decision = self._evidence.decision()
        if decision is None:
            return
        info = GaugeMetricFamily(
            "tiergate_tier_recipe_info",
            "What the fast tier runs, as measured and decided on this hardware (always 1)",
            labels=["tier", "recipe", "verdict", "cpu", "engine_mode"],
        )
        info.add_metric(
            [
                Tier.FAST.value,
                decision.recipe_name,
                decision.verdict,
                decision.fingerprint.get("cpu", "unknown"),
                decision.engine_mode,
            ],
            1.0,
        )
        speedup = GaugeMetricFamily(
            "tiergate_tier_speedup",
            "Fast/standard ratio of median time per output token, measured by the tuner",
            labels=["tier", "concurrency"],
        )
        for level, value in decision.speedup.items():
            speedup.add_metric([Tier.FAST.value, level], value)
        decided = GaugeMetricFamily(
            "tiergate_tier_decision_timestamp_seconds",
            "When the fast tier's recipe was measured and decided",
            value=decision.decided_at,
        )
        yield info
        yield speedup
        yield decided
