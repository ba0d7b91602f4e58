"""The drafts benchmark's report: ratios against no drafter from the same run, answers that
differ from no drafter's said, and a drafter that could not run named with its reason."""

from __future__ import annotations

from tiergate.bench.drafts import render


def _row(speed: float, answers: str = "same") -> dict[str, object]:
    row: dict[str, object] = {}
    for workload in ("natural", "repetitive"):
        row[f"{workload} first"] = speed
        row[f"{workload} again"] = speed * 2
        row[f"{workload} answers"] = answers
    return row


def test_the_report_gives_ratios_to_no_drafter_and_names_what_did_not_run() -> None:
    report = {
        "cpu": "Some CPU",
        "cores": 2,
        "model": "/models/m-W8A8",
        "max_tokens": 128,
        "measured": "2026-12-06 08:00 UTC",
        "rows": {
            "none": _row(50.0),
            "ngram": _row(75.0),
            "suffix, global tree": _row(100.0, answers="other"),
            "suffix, prompt only": "suffix decoding needs arctic-inference (make suffix-decoding)",
        },
    }
    text = render(report)
    assert "Some CPU (2 cores)" in text and "`m-W8A8`" in text
    ngram = next(line for line in text.splitlines() if line.startswith("| ngram |"))
    assert "75.0 (1.50x)" in ngram and "150.0 (1.50x)" in ngram and ngram.endswith("| yes |")
    changed = next(line for line in text.splitlines() if line.startswith("| suffix, global"))
    assert "100.0 (2.00x)" in changed and changed.endswith("| NO |")
    assert "| suffix, prompt only | suffix decoding needs arctic-inference" in text
