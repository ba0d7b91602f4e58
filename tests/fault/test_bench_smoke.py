"""The gateway benchmark runs end to end (a smoke: very short, no timed assertions).

It needs nginx, wrk and vllm-router, which `make test` installs (scripts/bootstrap.sh);
a missing one fails this test rather than skipping it."""

from __future__ import annotations

from pathlib import Path

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.servers import gateway_settings, running_gateway
from tiergate.bench.gateway import run_gateway_benchmark
from tiergate.bench.tiers import PLAIN, bench_tiers, render_tiers


def test_benchmark_writes_a_side_by_side_report(tmp_path: Path) -> None:
    lines: list[str] = []
    report = run_gateway_benchmark(
        tmp_path, 1.0, repeat=1, workers=(1, 2), streams=3, progress=lines.append
    )
    assert {"cpu_model", "command", "median", "runs", "disturbed_runs"} <= set(report)
    systems = report["median"]["systems"]
    assert set(systems) == {"direct", "vllm-router", "tiergate", "tiergate-2proc"}
    for measured in systems.values():
        assert {
            "saturation",
            "fixed_rate_ms",
            "sequential_ms",
            "stream_ttfb_ms",
            "stream_chunk_lateness_ms",
        } <= set(measured)
        assert measured["saturation"]["rps"] > 0 and measured["saturation"]["non_2xx"] == 0
        assert measured["fixed_rate_ms"]["n"] == 60  # 60 req/s each, for 1 s, all at once
    derived = report["median"]["derived"]["tiergate"]
    assert {"saturation_vs_vllm_router", "saturation_vs_direct", "added"} <= set(derived)
    # What the gateway says it adds, beside what the client sees it add.
    assert {"reported_overhead_p50_ms", "client_added_p50_ms"} <= set(derived)
    assert (tmp_path / "gateway-bench.json").is_file()
    markdown = (tmp_path / "gateway-bench.md").read_text()
    assert "vllm-router" in markdown and report["cpu_model"] in markdown
    assert any("run 1/1" in line for line in lines)
    # Each run is judged against its own vllm-router, and the verdicts are said (whatever
    # they are: this machine's figures are not asserted).
    verdict = report["runs"][0]["targets"]
    assert set(verdict) == {
        "saturation_vs_vllm_router",
        "fixed_rate_added_p50_ms",
        "stream_lateness_added_p50_ms",
    }
    assert all(isinstance(t["met"], bool) for t in verdict.values())
    assert "all three held in" in markdown and "of 1 run(s)" in markdown


def test_the_tier_benchmark_measures_a_plain_vllm_in_the_same_turns(
    fakes: list[FakeVllm],
) -> None:
    """Fakes stand in for the engines: the machinery, not the figures."""
    with running_gateway(gateway_settings([fakes[0].url], [fakes[2].url])) as base:
        result = bench_tiers(
            base, MODEL, [], [1, 2], 2, 8, rounds=3, plain=fakes[1].url, gpu="none"
        )
    # Both workloads by default: natural answers and agent-job-like repetitive ones.
    assert list(result["workloads"]) == ["natural", "repetitive"]
    for measured in result["workloads"].values():
        assert list(measured["tiers"]) == ["standard", "fast", PLAIN]
        assert set(measured["vs_plain"]) == {"1", "2"}
        assert set(measured["vs_plain"]["2"]) == {"standard", "fast"}
    # Each turn measured every target: the plain server was asked directly.
    assert fakes[1].record.requests == fakes[0].record.requests == fakes[2].record.requests > 0
    markdown = render_tiers(result, "tiergate bench tiers --plain-vllm URL")
    assert "plain `vllm serve`" in markdown and "| plain vllm | 2 |" in markdown
    assert "## natural answers" in markdown and "## repetitive answers" in markdown


def test_the_tier_benchmark_reports_the_tuners_candidates_beside_its_own(tmp_path: Path) -> None:
    # The body GET /v1/tiers gives when the tuner published a decision.
    from tiergate.bench.tiers import tuner_figures
    from tiergate.enginesettings import Recipe
    from tiergate.evidence import CandidateResult, TierDecision
    from tiergate.gateway.tierinfo import TierEvidence

    chosen = Recipe(name="W8A8-sq-gptq", quantize="W8A8", method="sq-gptq")
    decision = TierDecision(
        fingerprint={"cpu": "test"},
        fingerprint_digest="d",
        inputs_digest="i",
        decided_at=0.0,
        seconds=1.0,
        engine_mode="compiled",
        chosen=chosen,
        verdict="faster",
        reason="r",
        speedup={"1": 1.6},
        candidates=[
            CandidateResult(recipe=chosen, status="chosen", speedup={"1": 1.6, "4": 1.35}),
            CandidateResult(recipe=Recipe(name="bf16 + ngram"), status="too slow"),
        ],
    )
    decision.save(tmp_path / "decision.json")
    body = TierEvidence(str(tmp_path / "decision.json")).describe()
    figures = tuner_figures(body)
    assert [f["recipe"] for f in figures] == ["W8A8-sq-gptq", "bf16 + ngram"]
    assert figures[0]["speedup"] == {"1": 1.6, "4": 1.35} and figures[0]["status"] == "chosen"
    result = {"hardware": {}, "workloads": {}, "tuner": figures}
    markdown = render_tiers(result, "tiergate bench tiers")
    assert "| W8A8-sq-gptq | chosen | 1.60x | 1.35x | not judged |" in markdown
