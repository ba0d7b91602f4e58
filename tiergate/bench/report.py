"""Where every benchmark leaves its figures: ``NAME.json`` (the whole report) and
``NAME.md`` (the rendered one, also printed) in the chosen folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_report(out: Path, name: str, report: Any, markdown: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / f"{name}.md").write_text(markdown)
    print(markdown)


def table_head(*columns: str) -> list[str]:
    """A Markdown table's first two lines, after a blank one."""
    return ["", f"| {' | '.join(columns)} |", "|" + "---|" * len(columns)]
