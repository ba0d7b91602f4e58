from __future__ import annotations

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
