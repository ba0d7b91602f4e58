"""The real tuner, end to end with a reduced budget: it starts a candidate engine beside
the session's standard engine, measures it against the standard tier in one run, judges
parity where it could change the choice, writes a decision that follows the rules, reuses
it, and the gateway shows it to callers and operators.

What it chooses depends on the processor (speculation pays on some CPUs and not on
others), so the assertions hold the machinery to its rules, not to a verdict."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import FAST_RECIPE, VllmServer
from tests.fault.helpers import metric_value
from tests.servers import gateway_settings, running_gateway
from tiergate.evidence import TierDecision
from tiergate.settings import load_settings
from tiergate.tiers import Tier
from tiergate.tuning import tuner
from tiergate.tuning.decide import SLOWER_BAND

pytestmark = pytest.mark.e2e


def test_the_tuner_measures_decides_and_the_gateway_shows_it(
    vllm_servers: dict[Tier, VllmServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = load_settings(
        tuning={
            "candidates": [FAST_RECIPE.model_dump(mode="json")],
            "levels": [1, 2],
            "requests_per_level": 2,
            "rounds": 1,
            "max_tokens": 48,
            "parity_max_tasks": 30,
            "decision_file": str(tmp_path / "tier-decision.json"),
        }
    )
    # The session's engines run eager, so the tiers here serve eager: the candidate is
    # measured in that mode beside the running standard engine, and not again.
    eager = {t: p.model_copy(update={"enforce_eager": True}) for t, p in settings.profiles.items()}
    settings = settings.model_copy(update={"profiles": eager})
    progress: list[str] = []
    decision = tuner.Tuner(settings, progress.append).run(vllm_servers[Tier.STANDARD].url)
    assert decision.engine_mode == "eager" and decision.screening_mode is None

    assert TierDecision.load(tmp_path / "tier-decision.json") == decision
    assert (tmp_path / "tier-decision.md").read_text().startswith("# Tier decision")
    assert any("concurrency 2" in line for line in progress), progress
    [result] = decision.candidates
    assert set(result.speedup) == {"1", "2"} and all(v > 0 for v in result.speedup.values())
    assert all(result.tpot_ms[k] > 0 and result.standard_tpot_ms[k] > 0 for k in ("1", "2"))
    assert result.acceptance_rate is not None and 0 < result.acceptance_rate <= 1
    # "Slower" allows for the measurement's noise (decide.SLOWER_BAND): in the CI of 067bce9
    # on a Zen 5 a level measured just under 1.0x and the candidate was judged, as it must be.
    floor = settings.tuning.min_speedup_any_level * (1 - SLOWER_BAND)
    nowhere_slower = min(result.speedup.values()) >= floor
    # Judged exactly when it could be chosen (whether it passes depends on the engine's
    # sampler, so only the consequences are asserted).
    assert (result.parity is not None) == nowhere_slower
    proven = result.parity is not None and result.parity.passed
    if result.parity is not None:
        assert result.parity.tasks <= 30
        # Teacher-forced positions are scored unless the task comparison decided it first.
        assert result.parity.positions > 0 or result.parity.stopped_after == "tasks"
    # The rule, written out for one lossless candidate (not the code's own choose()): it
    # runs if proven (parity passed, nowhere slower), "faster" from min_speedup at concurrency 1,
    # "equal" below that; unproven, nothing runs and the tiers are "equal".
    assert FAST_RECIPE.lossless
    assert (decision.chosen == FAST_RECIPE) == proven
    faster = result.speedup["1"] >= settings.tuning.min_speedup  # 1.1 unless set
    assert decision.verdict == ("faster" if proven and faster else "equal")
    assert decision.chosen is not None or decision.verdict == "equal"
    assert decision.fingerprint["cores"] and decision.fingerprint["cpu"]

    assert result.status == (
        "chosen" if proven else "failed parity" if result.parity else "too slow"
    )

    # Reused on the same hardware without measuring again.
    def must_not_run(self: tuner.Tuner, standard_url: str | None = None) -> TierDecision:
        raise AssertionError("a matching decision was measured again")

    monkeypatch.setattr(tuner.Tuner, "run", must_not_run)
    assert tuner.ensure_decision(settings, progress.append) == decision

    gateway = gateway_settings(
        [vllm_servers[Tier.STANDARD].url],
        [vllm_servers[Tier.FAST].url],
        gateway={"log_requests": False, "tier_evidence_file": str(tmp_path / "tier-decision.json")},
    )
    with running_gateway(gateway) as base:
        tiers = httpx.get(f"{base}/v1/tiers").json()
        fast = next(t for t in tiers["data"] if t["tier"] == "fast")
        assert fast["runs"] == decision.recipe_name and fast["verdict"] == decision.verdict
        assert fast["hardware"]["cpu"] == decision.fingerprint["cpu"]
        assert tiers["decision"]["candidates"][0]["speedup"] == result.speedup
        assert metric_value(base, "tiergate_tier_recipe_info", recipe=decision.recipe_name) == 1
        assert metric_value(base, "tiergate_tier_speedup", concurrency="1") == pytest.approx(
            decision.speedup["1"]
        )
