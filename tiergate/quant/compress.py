"""Quantize a checkpoint with llm-compressor. A standalone script, run by ``tiergate quant
build`` with the quantization environment's Python: llm-compressor pins versions that the
serving environment's vLLM cannot share, so nothing of tiergate is imported here and the
serving environment never imports llm-compressor.

    python compress.py --source DIR --out DIR --scheme W8A8|W4A16 [--method rtn|gptq|sq-gptq]
        [--group-size 64] [--calibration FILE.jsonl] [--samples 64]

Methods: ``rtn`` rounds to nearest (no calibration); ``gptq`` calibrates the weights;
``sq-gptq`` (W8A8 only) is the calibrated INT8 of SmoothQuant's paper and vLLM's guide:
decoder layers that W8A8 hurts most are measured and kept in bf16 (sensitivity.py),
SmoothQuant migrates activation outliers into the weights (strength 0.8), then GPTQ.

Prints one JSON line on success: the tool versions and what was done.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def _say(message: str) -> None:
    print(f"[quant] {message}", file=sys.stderr, flush=True)


def _group_size(model: Any, wanted: int) -> int:
    """The largest group size not above ``wanted`` that divides every quantized layer."""
    import torch

    widths = {
        m.in_features
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and not name.endswith("lm_head")
    }
    for size in (wanted, 128, 64, 32, 16):
        if size <= wanted and all(w % size == 0 for w in widths):
            if size != wanted:
                _say(
                    f"group size {wanted} does not divide layer widths {sorted(widths)}; "
                    f"using {size}"
                )
            return size
    raise SystemExit(f"no group size divides the layer widths {sorted(widths)}")


def _sensitive_layers(
    source: str, tokenizer: Any, texts: list[str]
) -> tuple[list[int], list[float]]:
    """The decoder layers to keep in bf16, measured (sensitivity.py), and every layer's KL."""
    import torch
    from sensitivity import choose_kept, layer_sensitivity  # type: ignore[import-not-found]
    from transformers import AutoModelForCausalLM

    _say("measuring each decoder layer's sensitivity to W8A8 (float32, simulated)")
    exact = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    batches = [
        tokenizer(text, return_tensors="pt", truncation=True, max_length=256).input_ids
        for text in texts[:2]
    ]
    scores = layer_sensitivity(exact, batches, _say)
    kept = choose_kept(scores)
    worst = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)[:5]
    _say(
        "most sensitive layers (KL): "
        + ", ".join(f"{i}: {scores[i]:.5f}" for i in worst)
        + f"; kept in bf16: {kept or 'none'}"
    )
    del exact
    return kept, scores


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--scheme", choices=["W8A8", "W4A16"], required=True)
    parser.add_argument("--method", choices=["rtn", "gptq", "sq-gptq"], default="rtn")
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--calibration", default=None)
    parser.add_argument("--samples", type=int, default=64)
    args = parser.parse_args()

    import compressed_tensors
    import llmcompressor
    import torch
    import transformers
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    _say(f"1/3 loading {args.source}")
    model = AutoModelForCausalLM.from_pretrained(args.source, dtype="auto")
    tokenizer = AutoTokenizer.from_pretrained(args.source)
    # lm_head stays in higher precision: it is a small share of the weights and a large
    # share of the error.
    common: dict[str, Any] = {"targets": "Linear", "ignore": ["lm_head"]}
    group = None
    if args.scheme == "W8A8":
        # Per-channel INT8 weights, dynamic per-token INT8 activations: no calibration.
        common["scheme"] = "W8A8"
    else:
        group = _group_size(model, args.group_size)
        common.pop("targets")
        common["config_groups"] = {
            "group_0": {
                "targets": ["Linear"],
                "weights": {
                    "num_bits": 4,
                    "type": "int",
                    "symmetric": True,
                    "strategy": "group",
                    "group_size": group,
                },
            }
        }
    kwargs: dict[str, Any] = {}
    kept: list[int] = []
    scores: list[float] = []
    if args.method == "sq-gptq" and args.scheme != "W8A8":
        raise SystemExit("sq-gptq smooths activations for INT8: it is a W8A8 method")
    if args.method in ("gptq", "sq-gptq"):
        if not args.calibration:
            raise SystemExit("GPTQ needs calibration data (--calibration FILE.jsonl)")
        from datasets import Dataset

        texts = [
            json.loads(line)["text"]
            for line in Path(args.calibration).read_text().splitlines()
            if line.strip()
        ][: args.samples]
        dataset = Dataset.from_dict({"text": texts}).map(
            lambda row: tokenizer(row["text"], truncation=True, max_length=512),
            remove_columns=["text"],
        )
        kwargs = {"dataset": dataset, "num_calibration_samples": len(texts), "max_seq_length": 512}
        recipe: Any = GPTQModifier(**common)
        if args.method == "sq-gptq":
            kept, scores = _sensitive_layers(args.source, tokenizer, texts)
            common["ignore"] += [f"re:model[.]layers[.]{i}[.].*" for i in kept]
            from llmcompressor.modifiers.transform.smoothquant import SmoothQuantModifier

            recipe = [SmoothQuantModifier(smoothing_strength=0.8), GPTQModifier(**common)]
    else:
        recipe = QuantizationModifier(**common)
    _say(
        f"2/3 quantizing: {args.scheme}, {args.method}" + (f", group size {group}" if group else "")
    )
    oneshot(model=model, recipe=recipe, **kwargs)
    _say(f"3/3 saving to {args.out}")
    model.save_pretrained(args.out, save_compressed=True)
    tokenizer.save_pretrained(args.out)
    print(
        json.dumps(
            {
                "scheme": args.scheme,
                "method": args.method,
                "group_size": group,
                "calibration_samples": kwargs.get("num_calibration_samples", 0),
                "kept_bf16_layers": kept,
                "layer_kl": [round(score, 6) for score in scores],
                "seconds": round(time.monotonic() - started, 1),
                "versions": {
                    "llmcompressor": llmcompressor.__version__,
                    "compressed_tensors": compressed_tensors.__version__,
                    "transformers": transformers.__version__,
                    "torch": torch.__version__,
                },
            }
        )
    )


if __name__ == "__main__":
    main()
