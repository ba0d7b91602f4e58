from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tiergate.engine.gate import ParityMissing, ensure_parity
from tiergate.enginesettings import TierProfile
from tiergate.quant.build import MANIFEST, calibration_texts, checkpoint_sha256
from tiergate.quant.parity import (
    REPORT,
    ParityThresholds,
    SequenceFigures,
    _judge,
    has_passing_report,
    render,
)
from tiergate.quant.tasks import TASKS, code_of
from tiergate.speculative.measure import (
    NEAR_TIE_NATS,
    acceptance_between,
    first_divergence,
    spec_counters,
    tie_gap,
)

METRICS = """\
# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 40.0
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 18.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 9.0
"""


def test_acceptance_from_counter_deltas() -> None:
    before = spec_counters(METRICS)
    assert before == {"drafts": 10.0, "draft_tokens": 40.0, "accepted_tokens": 18.0}
    after = spec_counters(
        METRICS.replace(" 10.0", " 20.0").replace(" 40.0", " 80.0").replace(" 18.0", " 48.0")
    )
    acc = acceptance_between(before, after)
    assert acc.rate == pytest.approx(30 / 40)
    assert acc.mean_length == pytest.approx(1 + 30 / 10)
    assert spec_counters("") == {"drafts": 0.0, "draft_tokens": 0.0, "accepted_tokens": 0.0}


def test_first_divergence() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def _checkpoint(tmp_path: Path, report: dict[str, object] | None) -> Path:
    path = tmp_path / "model-W8A8"
    path.mkdir()
    (path / MANIFEST).write_text(json.dumps({"scheme": "W8A8"}))
    if report is not None:
        (path / REPORT).write_text(json.dumps(report))
    return path


def test_launcher_refuses_a_quantized_checkpoint_without_passing_parity(tmp_path: Path) -> None:
    unverified = _checkpoint(tmp_path, None)
    profile = TierProfile(model=str(unverified), port=9000)
    with pytest.raises(ParityMissing, match="quant verify"):
        ensure_parity(profile)
    ensure_parity(profile, skip=True)  # told explicitly
    (unverified / REPORT).write_text(json.dumps({"passed": False}))
    with pytest.raises(ParityMissing):
        ensure_parity(profile)
    (unverified / REPORT).write_text(json.dumps({"passed": True}))
    ensure_parity(profile)
    assert has_passing_report(unverified)
    # A plain (unquantized) checkpoint needs no report.
    plain = tmp_path / "plain"
    plain.mkdir()
    ensure_parity(TierProfile(model=str(plain), port=9000))


def test_checkpoint_hash_follows_the_weights(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"abc")
    (tmp_path / "config.json").write_text("{}")
    first = checkpoint_sha256(tmp_path)
    (tmp_path / MANIFEST).write_text("{}")  # the manifest is not part of the hash
    assert checkpoint_sha256(tmp_path) == first
    (tmp_path / "model.safetensors").write_bytes(b"abd")
    assert checkpoint_sha256(tmp_path) != first


def test_calibration_text_comes_from_the_machine() -> None:
    texts = calibration_texts(8)
    assert len(texts) == 8 and all(len(t) > 400 for t in texts)


def test_task_checkers() -> None:
    by_name = {t.name: t for t in TASKS}
    assert by_name["yes"].check("Yes.") and not by_name["yes"].check("Yes, sure")
    assert by_name["json"].check('Here: {"name": "Bob"}')
    assert not by_name["json"].check('{"name": "Alice"}')
    assert by_name["upper"].check("HELLO WORLD") and not by_name["upper"].check("Hello World")
    assert (
        code_of("text\n```python\ndef f():\n    return 1\n```\nmore") == "def f():\n    return 1\n"
    )


def test_report_renders_the_verdict() -> None:
    rows = [{"task": f"t{i}", "kind": "code", "standard": True, "fast": True} for i in range(9)]
    rows.append({"task": "add", "kind": "code", "standard": True, "fast": False})
    figures = [
        SequenceFigures(
            positions=100, agreements=97, kl_sum=1.0, logprob_standard=-300, logprob_fast=-303
        )
    ] * 5
    report = _judge(rows, figures, 1, ParityThresholds(), 1.0, [(2.0, 2.1)] * 30)
    text = render(report, "x")
    assert ("**passed**" in text) == report["passed"]
    assert "| add | code | True | False |" in text  # discordant tasks are listed
    assert "| t1 |" not in text


def test_tie_gap_scores_the_token_against_the_best_teacher_forced() -> None:
    # A fake engine (httpx.MockTransport) answering vLLM's completions with top logprobs
    # keyed as token ids (return_tokens_as_token_ids).
    asked: list[dict[str, Any]] = []

    def engine(request: httpx.Request) -> httpx.Response:
        asked.append(json.loads(request.content))
        top = {"token_id:7": -0.1, "token_id:9": -0.3, "token_id:4": -6.0}
        return httpx.Response(200, json={"choices": [{"logprobs": {"top_logprobs": [top]}}]})

    with httpx.Client(base_url="http://engine", transport=httpx.MockTransport(engine)) as c:
        assert tie_gap(c, "m", [1, 2, 3], 7) == 0.0
        assert tie_gap(c, "m", [1, 2, 3], 9) == pytest.approx(0.2)  # a near tie
        far = tie_gap(c, "m", [1, 2, 3], 4)
        assert far is not None and far > NEAR_TIE_NATS  # no tie: an unverified draft
        assert tie_gap(c, "m", [1, 2, 3], 5) is None  # not even in the top 20
    assert asked[0]["prompt"] == [1, 2, 3] and asked[0]["max_tokens"] == 1
    assert asked[0]["temperature"] == 0 and asked[0]["return_tokens_as_token_ids"] is True
