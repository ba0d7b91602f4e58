"""``tiergate bench batch`` runs end to end on a real broker, store and worker over
FakeVllm (a smoke: a short batch, vLLM's run-batch left out, no timed assertions); the
command line it would give vLLM's run-batch carries the standard engine's configuration."""

from __future__ import annotations

from pathlib import Path

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.jobstack import jobs_stack
from tiergate.bench.openaibatch import BatchBenchParams, bench_batch, run_batch_command
from tiergate.bench.openaibatch_report import render_batch
from tiergate.enginesettings import TierProfile


def test_the_batch_benchmark_measures_a_batch_and_the_interactive_lane(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    model.behaviour.chunk_delay = 0.01
    with jobs_stack(broker, s3, model, tmp_path, jobs={"batch_api": {"chunk_lines": 4}}) as stack:
        stack.start_worker()
        params = BatchBenchParams(stack.base, "unused", lines=12, probes=2, baseline=False)
        said: list[str] = []
        profile = TierProfile(model="/models/m", port=8101)
        result = bench_batch(params, profile, tmp_path / "work", said.append)
    ours = result["tiergate"]
    assert (ours["status"], ours["completed"], ours["failed"]) == ("completed", 12, 0)
    assert ours["output_tokens"] > 0 and ours["output_tokens_per_s"] > 0
    assert result["idle"]["requests"] == 2 and result["idle"]["ttft_p50_ms"] > 0
    assert result["params"]["model"] == MODEL and result["run_batch"] is None
    assert result["ratios"]["batch_vs_run_batch"] is None
    markdown = render_batch(result, "tiergate bench batch --lines 12 --no-baseline")
    assert result["hardware"]["cpu"] in markdown and "tiergate batch (completed)" in markdown
    assert any("the batch: 12 lines" in line for line in said)


def test_run_batch_is_given_the_standard_engines_configuration(tmp_path: Path) -> None:
    profile = TierProfile(
        model="/models/m", served_model_name="m", port=8101, max_model_len=2048, enforce_eager=True
    )
    cmd = run_batch_command(profile, tmp_path / "in.jsonl", tmp_path / "out.jsonl")
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.run_batch"]
    joined = " ".join(cmd)
    for part in ("--model /models/m", "--served-model-name m", "--max-model-len 2048"):
        assert part in joined
    assert "--enforce-eager" in cmd and "--port" not in cmd
