"""The gateway benchmark names what it lacks instead of failing obscurely."""

from __future__ import annotations

import shutil
import sys

import pytest

from tiergate.bench import gateway
from tiergate.measure.fingerprint import cpu_kind


def test_missing_vllm_router_fails_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", "/nonexistent/bin/python")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(SystemExit, match="vllm-router") as exc:
        gateway.find_vllm_router()
    assert "pip install vllm-router" in str(exc.value)


def test_cpu_model_is_named() -> None:
    assert gateway.cpu_model() != ""


def _cpuinfo(family: int, model: int, flags: str) -> str:
    return (
        f"processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: {family}\n"
        f"model\t\t: {model}\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 {flags}\n\n"
        f"processor\t: 1\ncpu family\t: {family}\nmodel\t\t: {model}\n"
    )


def test_two_processors_with_one_model_name_are_told_apart() -> None:
    # Two virtual machines both said "AMD EPYC": a Zen 3 with AVX2 only, and a Zen 5 with
    # AVX-512; their gateway figures differed by 2x, so a report must say which.
    zen3 = cpu_kind(_cpuinfo(25, 1, "avx avx2 fma"))
    zen5 = cpu_kind(_cpuinfo(26, 2, "avx avx2 fma avx512f avx512bw avx512_vnni avx512_bf16"))
    assert zen3 == "AMD EPYC (family 25 model 1; AVX2 only)"
    assert zen5 == "AMD EPYC (family 26 model 2; AVX-512, VNNI, BF16)"
    intel = cpu_kind(
        "model name\t: Intel(R) Xeon(R) Processor\ncpu family\t: 6\nmodel\t\t: 143\n"
        "flags\t\t: avx2 avx512f avx512_vnni avx512_bf16 amx_tile amx_int8\n"
    )
    assert intel == "Intel(R) Xeon(R) Processor (family 6 model 143; AVX-512, VNNI, BF16, AMX)"


def test_a_processor_without_numbers_or_vector_flags_is_its_name() -> None:
    assert cpu_kind("model name\t: Some CPU\nflags\t\t: fpu sse2\n") == "Some CPU"
    assert cpu_kind("") == "unknown"
