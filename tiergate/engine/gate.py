"""The parity gate at launch: a quantized checkpoint serves only with a passing report."""

from __future__ import annotations

import json
from pathlib import Path

from tiergate.enginesettings import TierProfile

# Written by ``tiergate quant build`` beside a quantized checkpoint and by the parity judge;
# the names are shared with ``tiergate.quant`` without importing it.
MANIFEST = "tiergate-manifest.json"
REPORT = "parity-report.json"


class ParityMissing(Exception):
    """A quantized fast-tier checkpoint without a passing parity report."""


def has_passing_report(checkpoint: Path) -> bool:
    path = checkpoint / REPORT
    if not path.is_file():
        return False
    try:
        return bool(json.loads(path.read_text()).get("passed"))
    except json.JSONDecodeError:
        return False


def ensure_parity(profile: TierProfile, skip: bool = False) -> None:
    """Refuse a quantized checkpoint (one built by ``tiergate quant build``) that has no
    passing parity report, unless told explicitly to skip the check."""
    path = Path(profile.model)
    if skip or not (path / MANIFEST).is_file() or has_passing_report(path):
        return
    raise ParityMissing(
        f"{path} is a quantized checkpoint without a passing parity report ({path / REPORT}); "
        "run `tiergate tune` (or `tiergate quant verify`), or pass --skip-parity-check"
    )
