"""The gateway benchmark runs end to end (a smoke: very short, no timed assertions).

It needs nginx, wrk and vllm-router, which `make test` installs (scripts/bootstrap.sh);
a missing one fails this test rather than skipping it."""

from __future__ import annotations

from pathlib import Path

from tiergate.bench.gateway import run_gateway_benchmark


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
    derived = report["median"]["derived"]["tiergate"]
    assert {"saturation_vs_vllm_router", "saturation_vs_direct", "added"} <= set(derived)
    # What the gateway says it adds, beside what the client sees it add.
    assert {"reported_overhead_p50_ms", "client_added_p50_ms"} <= set(derived)
    assert (tmp_path / "gateway-bench.json").is_file()
    markdown = (tmp_path / "gateway-bench.md").read_text()
    assert "vllm-router" in markdown and report["cpu_model"] in markdown
    assert any("run 1/1" in line for line in lines)
