"""Making sure a tier profile's checkpoint exists: the embedded model's import, and the
quantized checkpoint a profile asks for (built once, then reused)."""

from __future__ import annotations

from pathlib import Path

from tiergate.enginesettings import DEFAULT_MODEL_NAME, TierProfile
from tiergate.settings import Settings


def prepare_profile_model(profile: TierProfile, settings: Settings) -> Path:
    """``profile``'s checkpoint, made when missing: the embedded model imported into
    ``settings.cache_dir``, a quantized one built with ``settings.quant_python``."""
    from tiergate.quant.convert import prepare_embedded_model

    embedded = settings.cache_dir / "models" / DEFAULT_MODEL_NAME
    model = Path(profile.model)
    spec = profile.quantize
    if spec is None:
        if model == embedded:
            prepare_embedded_model(model)
        return model
    from tiergate.quant.build import build

    source = Path(spec.source)
    if source == embedded:
        prepare_embedded_model(source)
    built = build(
        settings.quant_python, source, model.parent, spec.scheme, spec.method, spec.group_size
    )
    if built != model:
        raise SystemExit(
            f"profile model {model} does not match the checkpoint its quantize "
            f"section builds ({built}); set model to {built}"
        )
    return built
