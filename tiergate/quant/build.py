"""``tiergate quant build``: INT8 (W8A8) and INT4 weight-only (W4A16) checkpoints of a
standard-tier checkpoint, in compressed-tensors format that vLLM loads, each with a
manifest (source and its hash, scheme, method, tool versions, size on disk).

llm-compressor runs in an environment of its own (``.venv-quant``, made by
``scripts/install-quant.sh``): its pins conflict with vLLM's.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tiergate.engine.gate import MANIFEST


def _say(message: str) -> None:
    print(f"[quant build] {message}", file=sys.stderr, flush=True)


def _interpreter(python: Path) -> Path:
    """The quantization environment's interpreter (settings' ``quant_python``)."""
    if not python.exists():
        raise SystemExit(f"no quantization environment at {python}: run scripts/install-quant.sh")
    return python


def checkpoint_sha256(path: Path) -> str:
    """A hash over the checkpoint's weight and config files, in name order."""
    digest = hashlib.sha256()
    for file in sorted(path.iterdir()):
        if file.suffix in (".safetensors", ".json") and file.name != MANIFEST:
            digest.update(file.name.encode())
            with file.open("rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()


def size_on_disk(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def calibration_texts(count: int) -> list[str]:
    """Calibration text generated from what is on every machine: the docstrings of Python's
    standard library (English prose and code, no download)."""
    import importlib
    import pkgutil

    texts: list[str] = []
    for module in sorted(m.name for m in pkgutil.iter_modules() if not m.name.startswith("_")):
        if len(texts) >= count:
            break
        try:
            doc = importlib.import_module(module).__doc__ or ""
        except Exception:  # a module that does not import here is simply skipped
            continue
        if len(doc) > 400:
            texts.append(doc[:2000])
    return texts


def checkpoint_path(source: Path, out_root: Path, scheme: str, method: str = "rtn") -> Path:
    """Where :func:`build` puts the ``scheme``/``method`` copy of ``source``."""
    return out_root / (f"{source.name}-{scheme}" + ("" if method == "rtn" else f"-{method}"))


def build(
    python: Path,
    source: Path,
    out_root: Path,
    scheme: str,
    method: str = "rtn",
    group_size: int = 64,
    samples: int = 64,
) -> Path:
    """Build one quantized checkpoint, or reuse it when its manifest matches the source."""
    source_hash = checkpoint_sha256(source)
    out = checkpoint_path(source, out_root, scheme, method)
    manifest_path = out / MANIFEST
    if manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("source_sha256") == source_hash and manifest.get("method") == method:
            _say(f"ready: {out}")
            return out
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    args = [
        str(_interpreter(python)),
        str(Path(__file__).with_name("compress.py")),
        "--source",
        str(source),
        "--out",
        str(tmp),
        "--scheme",
        scheme,
        "--method",
        method,
        "--group-size",
        str(group_size),
        "--samples",
        str(samples),
    ]
    if method != "rtn":
        calibration = out_root / "calibration.jsonl"
        calibration.write_text(
            "".join(json.dumps({"text": t}) + "\n" for t in calibration_texts(samples))
        )
        args += ["--calibration", str(calibration)]
    _say(f"{scheme} ({method}) from {source}")
    started = time.monotonic()
    proc = subprocess.run(args, stdout=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"quantization failed ({proc.returncode}); see the messages above")
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    manifest = {
        "source": str(source),
        "source_sha256": source_hash,
        "scheme": scheme,
        "method": method,
        "group_size": report.get("group_size"),
        "calibration_samples": report.get("calibration_samples", 0),
        "lm_head": "unquantized",
        "kept_bf16_layers": report.get("kept_bf16_layers", []),
        "format": "compressed-tensors",
        "tool_versions": report["versions"],
        "size_bytes": size_on_disk(tmp),
        "source_size_bytes": size_on_disk(source),
        "built_at": int(time.time()),
        "seconds": round(time.monotonic() - started, 1),
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    _say(
        f"ready in {manifest['seconds']}s: {out} ({manifest['size_bytes'] / 1e6:.0f} MB, "
        f"source {manifest['source_size_bytes'] / 1e6:.0f} MB)"
    )
    return out
