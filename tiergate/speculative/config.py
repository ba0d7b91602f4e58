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
    # vLLM's dynamic speculative decoding: (first batch size, last batch size, tokens to
    # draft) ranges, the first starting at 1 (vLLM's scheduler applies it to every method).
    # On a CPU, verifying drafts for a batch of several sequences costs more than the drafts
    # save: [[1, 1, 3], [2, 1024, 0]] drafts for a lone sequence only (the INT8 recipe's
    # ngram gain at concurrency 1 without its loss at 4).
    num_speculative_tokens_per_batch_size: list[tuple[int, int, int]] | None = None

    @model_validator(mode="after")
    def _schedule(self) -> _Method:
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
    """Suffix-tree drafting (vLLM's ``suffix`` method, Arctic Inference's suffix trees): over
    the request's own prompt and output, and, unless ``suffix_decoding_max_cached_requests``
    is 0, over the answers of earlier requests, which is where it drafts most (a task
    sampled again, a command an agent repeats). Needs the ``arctic-inference`` package in
    the engine's Python (``make suffix-decoding``)."""

    method: Literal["suffix"] = "suffix"
    # The most tokens one draft may hold (vLLM's default is the tree depth, 24).
    num_speculative_tokens: int = Field(8, ge=1, le=32)
    suffix_decoding_max_tree_depth: int = Field(24, ge=1)
    # Earlier requests kept in the global tree (0: the prompt's own tree only). The tree is
    # what suffix decoding is worth (4-5x on an answer seen before, `tiergate bench
    # drafts`); the tuner's speed measure sends each prompt more than once, so its figure
    # for a recipe with a tree overstates what a new caller sees (docs/fast-tier.md). The
    # tree is shared by every caller of the engine: a timing side channel between tenants
    # (their drafts speed each other up), so keep it at 0 where tenants do not trust each
    # other.
    suffix_decoding_max_cached_requests: int = Field(10_000, ge=0)
    suffix_decoding_max_spec_factor: float = Field(1.0, ge=0)
    suffix_decoding_min_token_prob: float = Field(0.1, ge=0, le=1)


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
