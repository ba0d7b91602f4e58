"""Turning a recipe (or the tuner's decision) into the fast tier's engine profile."""

from __future__ import annotations

from pathlib import Path

from tiergate.enginesettings import QuantizeSpec, Recipe, TierProfile
from tiergate.evidence import TierDecision


def recipe_profile(fast: TierProfile, recipe: Recipe | None, standard_model: str) -> TierProfile:
    """``fast`` (its port, cores, engine settings) running ``recipe`` on the standard
    checkpoint; ``None`` is the standard configuration itself (its quantized checkpoint is
    made by :func:`tiergate.quant.prepare.prepare_profile_model`)."""
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
    return fast.model_copy(update=update)


def decided_profile(fast: TierProfile, decision: TierDecision, standard_model: str) -> TierProfile:
    """The fast tier's profile as the decision says."""
    return recipe_profile(fast, decision.chosen, standard_model)
