"""The fast tier's promise, checked on the real servers: its quantized checkpoint answers
like the standard tier (the parity gate), and its speculation is measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import MODEL, VllmServer
from tiergate.quant.build import MANIFEST
from tiergate.quant.parity import Endpoint, ParityThresholds, evaluate, render
from tiergate.speculative.measure import losslessness, measure_acceptance
from tiergate.tiers import Tier

pytestmark = pytest.mark.e2e


def test_fast_checkpoint_passes_the_parity_gate(
    vllm_servers: dict[Tier, VllmServer], tmp_path: Path
) -> None:
    fast = vllm_servers[Tier.FAST]
    manifest = json.loads((Path(fast.model) / MANIFEST).read_text())
    assert manifest["format"] == "compressed-tensors" and manifest["lm_head"] == "unquantized"
    assert manifest["size_bytes"] < manifest["source_size_bytes"]
    report = evaluate(
        Endpoint(vllm_servers[Tier.STANDARD].url, MODEL),
        Endpoint(fast.url, MODEL),
        ParityThresholds.for_scheme(manifest["scheme"]),
        progress=lambda m: None,
    )
    (tmp_path / "parity.md").write_text(render(report, "e2e"))
    assert report["perplexity"]["standard"] > 1
    assert report["top1_agreement"]["standard_vs_itself"] > 0.9
    assert report["tasks"]["standard_passed"] > 0
    assert report["passed"], render(report, "e2e")


def test_fast_tier_speculation_is_measured(vllm_servers: dict[Tier, VllmServer]) -> None:
    acceptance = measure_acceptance(vllm_servers[Tier.FAST].url, MODEL, max_tokens=64)
    assert acceptance.drafts > 0 and acceptance.draft_tokens >= acceptance.drafts
    assert 0 < acceptance.rate <= 1
    assert 1 < acceptance.mean_length <= 5  # at most num_speculative_tokens + 1


def test_losslessness_check_runs_token_by_token(vllm_servers: dict[Tier, VllmServer]) -> None:
    # The same speculative engine twice: greedy decoding must repeat itself exactly.
    fast = vllm_servers[Tier.FAST].url
    report = losslessness(fast, fast, MODEL, max_tokens=32)
    assert report["prompts"] == 8
    assert report["exact_match_rate"] == 1.0, report["rows"]


def _broken_copy(source: Path, out: Path) -> Path:
    """A deliberately broken 'fast' checkpoint: the standard weights with noise added to
    every projection (about half the weights' own spread)."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, out)
    generator = torch.Generator().manual_seed(0)
    for path in out.glob("*.safetensors"):
        tensors = load_file(str(path))
        for name, tensor in tensors.items():
            if name.endswith("proj.weight"):
                noise = torch.randn(tensor.shape, generator=generator) * tensor.float().std()
                tensors[name] = (tensor.float() + 0.5 * noise).to(tensor.dtype)
        save_file(tensors, str(path), metadata={"format": "pt"})
    (out / MANIFEST).write_text(json.dumps({"scheme": "W8A8", "note": "deliberately broken"}))
    return out


def test_parity_gate_fails_a_broken_checkpoint(
    vllm_servers: dict[Tier, VllmServer], tmp_path: Path
) -> None:
    from tests.servers import free_port
    from tiergate.backends.launcher import ParityMissing, ensure_parity, start_vllm
    from tiergate.quant.parity import write_report
    from tiergate.settings import TierProfile
    from tiergate.stack import healthy, stop_process_group

    standard = vllm_servers[Tier.STANDARD]
    broken = _broken_copy(Path(standard.model), tmp_path / "broken-W8A8")
    profile = TierProfile(model=str(broken), port=free_port(), enforce_eager=True, cpu_cores="1")
    proc = start_vllm(profile, tmp_path / "broken.log")
    url = f"http://127.0.0.1:{profile.port}"
    try:
        import time

        deadline = time.monotonic() + 300
        while not healthy(url):
            assert proc.poll() is None and time.monotonic() < deadline, (
                tmp_path / "broken.log"
            ).read_text()[-2000:]
            time.sleep(1)
        report = evaluate(
            Endpoint(standard.url, MODEL),
            Endpoint(url, MODEL),
            ParityThresholds.for_scheme("W8A8"),
            progress=lambda m: None,
        )
    finally:
        stop_process_group(proc)
    assert not report["passed"], render(report, "broken")
    assert report["perplexity"]["ratio"] > ParityThresholds().max_perplexity_ratio
    write_report(report, broken, "broken")
    with pytest.raises(ParityMissing):
        ensure_parity(profile)
