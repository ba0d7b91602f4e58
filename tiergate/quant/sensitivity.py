"""Which decoder layers does W8A8 hurt most? Measured, for compress.py (standalone: run
with the quantization environment's Python; nothing of tiergate is imported here).

Each decoder layer in turn gets simulated W8A8 on all of its linear layers (weights
symmetric per output channel, activations symmetric per token, both rounded to INT8, as
vLLM-CPU's kernel computes them), the rest of the model stays exact (float32), and the
whole model scores held-out text: the layer's sensitivity is the mean KL divergence of
the next-token distributions from the exact model's, over every position. That is the
parity judge's measure (KL of the quantized model's next-token distribution from the
reference's), one layer at a time.

:func:`choose_kept` keeps in bf16 the layers whose KL stands out: above ``factor`` times
the median layer's, at most ``max_share`` of the layers, largest first. A model whose
layers are all alike keeps none; one with a few outliers (typically the first or last
layers, or one whose activations carry outlier channels) keeps those.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


def _fake_int8(x: Any, dim: int) -> Any:
    scale = x.abs().amax(dim=dim, keepdim=True).clamp(min=1e-8) / 127.0
    return (x / scale).round().clamp(-127, 127) * scale


@contextmanager
def simulated_w8a8(block: Any) -> Iterator[None]:
    """Every ``torch.nn.Linear`` inside ``block`` computes as W8A8 while inside."""
    import torch

    saved: list[tuple[Any, Any, Any]] = []
    try:
        for module in block.modules():
            if isinstance(module, torch.nn.Linear):
                weight = module.weight.data
                module.weight.data = _fake_int8(weight, dim=1)
                handle = module.register_forward_pre_hook(
                    lambda _m, args: (_fake_int8(args[0], dim=-1), *args[1:])
                )
                saved.append((module, weight, handle))
        yield
    finally:
        for module, weight, handle in saved:
            module.weight.data = weight
            handle.remove()


def layer_sensitivity(
    model: Any, batches: list[Any], say: Callable[[str], None] = lambda m: None
) -> list[float]:
    """Mean KL(exact || layer i in W8A8) per decoder layer, over ``batches`` of token ids."""
    import torch

    layers = model.model.layers
    with torch.no_grad():
        reference = [torch.log_softmax(model(ids).logits.float(), -1) for ids in batches]
        scores = []
        for index, layer in enumerate(layers):
            total = count = 0.0
            with simulated_w8a8(layer):
                for ids, ref in zip(batches, reference, strict=True):
                    logq = torch.log_softmax(model(ids).logits.float(), -1)
                    kl = (ref.exp() * (ref - logq)).sum(-1)
                    total += float(kl.sum())
                    count += kl.numel()
            scores.append(total / count)
            if (index + 1) % 10 == 0 or index + 1 == len(layers):
                say(f"sensitivity: {index + 1}/{len(layers)} layers measured")
    return scores


def choose_kept(scores: list[float], factor: float = 3.0, max_share: float = 0.1) -> list[int]:
    """The layers to keep in bf16: KL above ``factor`` x the median, at most ``max_share``
    of the layers (rounded down), the largest first; returned in layer order."""
    if not scores:
        return []
    ordered = sorted(scores)
    median = ordered[len(ordered) // 2]
    limit = int(len(scores) * max_share)
    worst = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)
    return sorted(i for i in worst[:limit] if scores[i] > factor * median)
