from __future__ import annotations

import json

import pytest
from pydantic import TypeAdapter, ValidationError

from tiergate.speculative.config import SpeculativeConfig, to_vllm_json

ADAPTER: TypeAdapter[SpeculativeConfig] = TypeAdapter(SpeculativeConfig)


def test_ngram_renders_for_vllm() -> None:
    cfg = ADAPTER.validate_python({"method": "ngram", "num_speculative_tokens": 3})
    assert to_vllm_json(cfg) == (
        '{"num_speculative_tokens":3,"method":"ngram","prompt_lookup_max":4,"prompt_lookup_min":2}'
    )


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"method": "ngram", "prompt_lookup_min": 5, "prompt_lookup_max": 2}, "prompt_lookup_min"),
        ({"method": "eagle3"}, "model"),
        ({"method": "medusa2", "model": "x"}, "method"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"method": "ngram", "draft_tensor_parallel_size": 2}, "draft_tensor_parallel_size"),
    ],
)
def test_wrong_combinations_are_named(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ADAPTER.validate_python(raw)


def test_a_batch_size_schedule_renders_for_vllm_and_bad_ones_are_named() -> None:
    cfg = ADAPTER.validate_python(
        {
            "method": "ngram",
            "num_speculative_tokens": 3,
            "num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 1024, 0]],
        }
    )
    assert '"num_speculative_tokens_per_batch_size":[[1,1,3],[2,1024,0]]' in to_vllm_json(cfg)
    for schedule in ([[2, 8, 3]], [[1, 1, 4]], [[1, 4, 3], [0, 2, 1]], [[1, 0, 3]], []):
        with pytest.raises(ValidationError, match="num_speculative_tokens_per_batch_size"):
            ADAPTER.validate_python(
                {
                    "method": "ngram",
                    "num_speculative_tokens": 3,
                    "num_speculative_tokens_per_batch_size": schedule,
                }
            )


def test_suffix_decoding_renders_its_knobs_and_a_schedule_for_vllm() -> None:
    cfg = ADAPTER.validate_python(
        {
            "method": "suffix",
            "suffix_decoding_max_cached_requests": 0,
            "num_speculative_tokens_per_batch_size": [[1, 1, 8], [2, 1024, 0]],
        }
    )
    rendered = json.loads(to_vllm_json(cfg))
    assert rendered["method"] == "suffix"
    assert rendered["num_speculative_tokens"] == 8
    assert rendered["suffix_decoding_max_cached_requests"] == 0
    assert rendered["num_speculative_tokens_per_batch_size"] == [[1, 1, 8], [2, 1024, 0]]
    for wrong in (
        {"suffix_decoding_max_cached_requests": -1},
        {"suffix_decoding_min_token_prob": 1.5},
        {"prompt_lookup_max": 4},  # an ngram knob
    ):
        with pytest.raises(ValidationError):
            ADAPTER.validate_python({"method": "suffix", **wrong})
