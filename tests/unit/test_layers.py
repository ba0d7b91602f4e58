"""The packages stand on one another as the README's Development section draws them: an
import of ours goes only to a lower row, so that no cycle and no sideways tie grows back."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "tiergate"

# Top to bottom, as in the README; a module's first path part names its room.
ROWS = [
    {"__main__"},
    {"cli"},
    {"stack", "bench"},
    {"gateway", "tuning"},
    {"jobs", "quant"},
    {"queue", "backends", "engine", "local"},
    {"envs", "measure"},
    {"sandbox", "objectstore", "jobsclient", "evidence", "chartschema"},
    {"protocol", "settings", "jobsettings", "enginesettings", "sectionbase"},
    {"tiers", "speculative"},
]
# One room in the picture, several modules in the tree.
SAME_ROOM = [{"settings", "jobsettings", "enginesettings", "sectionbase"}]
_IMPORT = re.compile(r"^\s*(?:from|import) tiergate\.(\w+)", re.M)


def _row(room: str) -> int:
    for index, row in enumerate(ROWS):
        if room in row:
            return index
    raise AssertionError(f"tiergate/{room} is in no row of the picture: add it (and README)")


def _room(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def test_every_import_goes_to_a_lower_row() -> None:
    upward = []
    for path in PACKAGE.rglob("*.py"):
        source = _room(path)
        if source == "__init__":
            continue
        for target in set(_IMPORT.findall(path.read_text())):
            if target == source or any({source, target} <= room for room in SAME_ROOM):
                continue
            if _row(target) <= _row(source):
                upward.append(f"{path.relative_to(PACKAGE.parent)} imports tiergate.{target}")
    assert not upward, "\n".join(sorted(upward))
