"""Making sure a tier profile's checkpoint exists: the embedded model's import, and the
quantized checkpoint a profile asks for (built once, then reused)."""

from __future__ import annotations

from pathlib import Path

from tiergate.settings import DEFAULT_MODEL_NAME, TierProfile, default_cache_dir


def _embedded(path: Path) -> bool:
    return path == default_cache_dir() / "models" / DEFAULT_MODEL_NAME


def prepare_profile_model(profile: TierProfile) -> Path:
    from tiergate.quant.convert import prepare_embedded_model

    model = Path(profile.model)
    spec = profile.quantize
    if spec is None:
        if _embedded(model):
            prepare_embedded_model(model)
        return model
    from tiergate.quant.build import build

    source = Path(spec.source)
    if _embedded(source):
        prepare_embedded_model(source)
    built = build(source, model.parent, spec.scheme, spec.method, spec.group_size)
    if built != model:
        raise SystemExit(
            f"profile model {model} does not match the checkpoint its quantize "
            f"section builds ({built}); set model to {built}"
        )
    return built
