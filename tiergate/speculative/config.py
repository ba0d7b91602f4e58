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

    @model_validator(mode="after")
    def _window(self) -> NgramConfig:
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"prompt_lookup_min ({self.prompt_lookup_min}) must not exceed "
                f"prompt_lookup_max ({self.prompt_lookup_max})"
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
