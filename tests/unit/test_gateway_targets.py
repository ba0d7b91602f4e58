"""The gateway benchmark's targets, judged per run against that run's vllm-router."""

from __future__ import annotations

from typing import Any

from tiergate.bench.gateway_report import targets


def _derived(saturation: float, ours_p50: float, router_p50: float, lateness: float) -> Any:
    return {
        "tiergate": {
            "saturation_vs_vllm_router": saturation,
            "added": {"fixed_rate_p50_ms": ours_p50, "stream_lateness_p50_ms": lateness},
        },
        "vllm-router": {"added": {"fixed_rate_p50_ms": router_p50}},
    }


def test_a_run_inside_every_bound_meets_all_three() -> None:
    verdict = targets(_derived(0.5, 1.4, 0.9, 0.49))
    assert all(t["met"] for t in verdict.values())
    assert verdict["fixed_rate_added_p50_ms"]["bound"] == 1.4


def test_each_bound_is_judged_on_its_own() -> None:
    verdict = targets(_derived(0.49, 1.41, 0.9, 0.5))
    assert [t["met"] for t in verdict.values()] == [False, False, False]
    # The latency bound moves with the run's own vllm-router.
    assert targets(_derived(0.6, 1.41, 1.0, 0.1))["fixed_rate_added_p50_ms"]["met"]
