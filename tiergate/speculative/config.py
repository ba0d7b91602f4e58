"""Typed speculative-decoding configuration, validated before vLLM starts.

Rendered to vLLM's ``--speculative-config`` JSON by :func:`to_vllm_json`. A wrong
combination fails here with a message naming the field, not as a vLLM stack trace.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import BaseModel, Field, model_validator


class _Method(BaseModel):
    model_config = {"extra": "forbid"}

    num_speculative_tokens: int = Field(4, ge=1, le=16)


class NgramConfig(_Method):
    """Prompt-lookup drafting: no draft model, works on the CPU."""

    method: Literal["ngram"] = "ngram"
    prompt_lookup_max: int = Field(4, ge=1)
    prompt_lookup_min: int = Field(2, ge=1)
    # vLLM's dynamic speculative decoding: (first batch size, last batch size, tokens to
    # draft) ranges, the first starting at 1. On a CPU, verifying drafts for a batch of
    # several sequences costs more than the drafts save: [[1, 1, 3], [2, 1024, 0]] drafts
    # for a lone sequence only (the INT8 recipe's ngram gain at concurrency 1 without its
    # loss at 4).
    num_speculative_tokens_per_batch_size: list[tuple[int, int, int]] | None = None

    @model_validator(mode="after")
    def _window(self) -> NgramConfig:
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"prompt_lookup_min ({self.prompt_lookup_min}) must not exceed "
                f"prompt_lookup_max ({self.prompt_lookup_max})"
            )
        schedule = self.num_speculative_tokens_per_batch_size
        if schedule is not None:
            starts = [first for first, _, _ in schedule]
            if not schedule or starts[0] != 1 or starts != sorted(starts):
                raise ValueError(
                    "num_speculative_tokens_per_batch_size: ranges in order, the first from "
                    "batch size 1"
                )
            for first, last, tokens in schedule:
                if not 1 <= first <= last or not 0 <= tokens <= self.num_speculative_tokens:
                    raise ValueError(
                        f"num_speculative_tokens_per_batch_size: ({first}, {last}, {tokens}) "
                        "needs 1 <= first <= last and 0 <= tokens <= num_speculative_tokens"
                    )
        return self


class SuffixConfig(_Method):
    """Suffix-tree drafting over the prompt and earlier outputs."""

    method: Literal["suffix"] = "suffix"


class DraftModelConfig(_Method):
    """A smaller model of the same tokenizer drafts tokens."""

    method: Literal["draft_model"] = "draft_model"
    model: str
    draft_tensor_parallel_size: int | None = Field(None, ge=1)


class Eagle3Config(_Method):
    """An EAGLE-3 speculator head trained for the target model."""

    method: Literal["eagle3"] = "eagle3"
    model: str


class MtpConfig(_Method):
    """The model's own multi-token-prediction layers (DeepSeek, Qwen3-Next, ...)."""

    method: Literal["mtp"] = "mtp"
    num_speculative_tokens: int = Field(1, ge=1, le=4)


SpeculativeConfig = Annotated[
    NgramConfig | SuffixConfig | DraftModelConfig | Eagle3Config | MtpConfig,
    Field(discriminator="method"),
]


def to_vllm_json(config: BaseModel) -> str:
    """Render a speculative configuration as the JSON vLLM takes on its command line."""
    return json.dumps(config.model_dump(exclude_none=True), separators=(",", ":"))
