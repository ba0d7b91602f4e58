"""Output speed of a candidate engine against the standard engine, measured in one run.

Both engines answer the same natural prompts (greedy, ending on their own, up to
``max_tokens``) at each concurrency level, interleaved in alternating rounds so that a slow
minute of a shared machine does not land on one engine only. The figure is the ratio of
median time per output token (standard / candidate: above 1 is faster).
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from tiergate.measure.quiet import QuietWatch
from tiergate.measure.stream import Sample, run_level

Progress = Callable[[str], None]


@dataclass
class SpeedFigures:
    """Median TPOT (ms) per level for both engines, and the speedups."""

    standard_tpot_ms: dict[str, float] = field(default_factory=dict)
    candidate_tpot_ms: dict[str, float] = field(default_factory=dict)

    @property
    def speedup(self) -> dict[str, float]:
        return {
            level: self.standard_tpot_ms[level] / max(1e-9, tpot)
            for level, tpot in self.candidate_tpot_ms.items()
        }


def median_tpot_ms(samples: list[Sample]) -> float:
    tpots = [s.tpot for s in samples if s.tpot]
    if not tpots:
        raise RuntimeError("no request produced two or more tokens")
    return statistics.median(tpots) * 1000


def measure_speed(
    standard_url: str,
    candidate_url: str,
    model: str,
    levels: list[int],
    requests_per_level: int,
    max_tokens: int,
    rounds: int = 2,
    progress: Progress = print,
    quiet: QuietWatch | None = None,
) -> SpeedFigures:
    """``quiet``: run each timed round in a quiet window of the serving engines it watches,
    again when a user's request shared it (tiergate.measure.quiet)."""
    figures = SpeedFigures()
    engines = (("standard", standard_url), ("candidate", candidate_url))
    for level in levels:
        per_round = max(level, -(-max(requests_per_level, level) // rounds))
        collected: dict[str, list[Sample]] = {"standard": [], "candidate": []}
        for round_ in range(rounds):
            for name, url in engines if round_ % 2 == 0 else engines[::-1]:

                def one_round(
                    url: str = url, level: int = level, n: int = per_round
                ) -> list[Sample]:
                    chat = f"{url}/v1/chat/completions"
                    samples, _ = asyncio.run(run_level(chat, model, None, level, n, max_tokens))
                    return samples

                collected[name] += (
                    one_round() if quiet is None else quiet.run(one_round, {url: per_round})
                )
        level_key = str(level)
        figures.standard_tpot_ms[level_key] = median_tpot_ms(collected["standard"])
        figures.candidate_tpot_ms[level_key] = median_tpot_ms(collected["candidate"])
        progress(
            f"  concurrency {level}: standard {figures.standard_tpot_ms[level_key]:.1f} ms, "
            f"candidate {figures.candidate_tpot_ms[level_key]:.1f} ms per output token "
            f"({figures.speedup[level_key]:.2f}x)"
        )
    return figures
