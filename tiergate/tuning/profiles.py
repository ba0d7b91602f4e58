"""Turning a recipe (or the tuner's decision) into the fast tier's engine profile."""

from __future__ import annotations

from pathlib import Path

from tiergate.evidence import TierDecision
from tiergate.settings import QuantizeSpec, Recipe, TierProfile


def recipe_profile(
    fast: TierProfile, recipe: Recipe | None, standard_model: str, build: bool = False
) -> TierProfile:
    """``fast`` (its port, cores, engine settings) running ``recipe`` on the standard
    checkpoint; ``None`` is the standard configuration itself. With ``build``, a quantized
    checkpoint is built now when missing."""
    update: dict[str, object] = {
        "tuned": False,
        "model": standard_model,
        "quantize": None,
        "speculative": None,
    }
    if recipe is not None:
        update["speculative"] = recipe.speculative
        if recipe.quantize is not None:
            from tiergate.quant.build import checkpoint_path

            source = Path(standard_model)
            spec = QuantizeSpec(
                source=standard_model,
                scheme=recipe.quantize,
                method=recipe.method,
                group_size=recipe.group_size,
            )
            update["quantize"] = spec
            update["model"] = str(checkpoint_path(source, source.parent, spec.scheme, spec.method))
    profile = fast.model_copy(update=update)
    if build:
        from tiergate.quant.prepare import prepare_profile_model

        prepare_profile_model(profile)
    return profile


def decided_profile(fast: TierProfile, decision: TierDecision, standard_model: str) -> TierProfile:
    """The fast tier's profile as the decision says."""
    return recipe_profile(fast, decision.chosen, standard_model)
