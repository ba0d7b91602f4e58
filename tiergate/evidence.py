"""What each tier runs and the evidence for it: the tuner's decision, as a typed record.

``tiergate tune`` writes it (beside the checkpoints) after measuring every candidate recipe
on this machine; the local stack starts the fast tier from it; the gateway shows it to
callers (``GET /v1/tiers``) and operators (``/metrics``). A decision holds only for the
hardware it was measured on: :attr:`TierDecision.fingerprint` names that hardware, and a
decision whose fingerprint differs from the machine's is stale.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from tiergate.enginesettings import Recipe

TierVerdict = Literal["faster", "equal"]
CandidateStatus = Literal["chosen", "passed", "failed parity", "too slow", "skipped", "error"]


class ParitySummary(BaseModel):
    """The headline figures of one parity judgement (the full report lies beside it)."""

    passed: bool
    next_token_agreement: float
    agreement_low: float
    kl_mean: float
    kl_high: float
    task_difference: float
    task_difference_low: float
    sampled_nll_gap: float = 0.0
    sampled_nll_gap_high: float = 0.0
    tasks: int
    positions: int
    seconds: float
    # The judgement stopped once its verdict was decided: after "tasks" or "scoring"
    # (tiergate.quant.parity); the figures it did not measure read 0.
    stopped_after: str | None = None


class CandidateResult(BaseModel):
    """One recipe measured against the standard tier in the same run."""

    recipe: Recipe
    status: CandidateStatus
    # Per concurrency level: the standard tier's median time per output token divided by
    # the candidate's (above 1 is faster).
    speedup: dict[str, float] = Field(default_factory=dict)
    tpot_ms: dict[str, float] = Field(default_factory=dict)
    standard_tpot_ms: dict[str, float] = Field(default_factory=dict)
    acceptance_rate: float | None = None
    parity: ParitySummary | None = None
    note: str = ""
    # Set when the candidate was screened in another engine mode than the tiers serve in
    # and then measured again as served (tuning.screen_eager): the screening's speedups.
    # ``speedup`` and the TPOT figures are then the serving mode's, which the choice uses.
    screened_speedup: dict[str, float] = Field(default_factory=dict)


class TierDecision(BaseModel):
    """The fast tier chosen for one machine, with the evidence."""

    version: Literal[1] = 1
    fingerprint: dict[str, str]
    fingerprint_digest: str
    # The tuning inputs (standard checkpoint, candidates, thresholds) it answers for.
    inputs_digest: str
    decided_at: float
    seconds: float
    # The engine mode the tiers serve in, and the one the candidates were screened in
    # (``None``: the same).
    engine_mode: Literal["eager", "compiled"]
    screening_mode: Literal["eager", "compiled"] | None = None
    # ``None``: the fast tier runs the standard configuration itself.
    chosen: Recipe | None
    verdict: TierVerdict
    reason: str
    speedup: dict[str, float] = Field(default_factory=dict)
    candidates: list[CandidateResult] = Field(default_factory=list)
    # Where the tuning's seconds went: building checkpoints, starting candidate engines,
    # timing them, judging parity, measuring the choice as served (they overlap with
    # nothing; the rest of ``seconds`` is the screening's own standard engine and the
    # tuner's bookkeeping).
    phase_seconds: dict[str, float] = Field(default_factory=dict)
    # Timed rounds run again because a user's request shared the serving engines
    # (tiergate.measure.quiet: the local stack tunes while it serves).
    rounds_measured_again: int = 0

    @property
    def recipe_name(self) -> str:
        return self.chosen.name if self.chosen else "standard configuration"

    def public(self) -> dict[str, Any]:
        """What callers see: every figure, no local paths."""
        return self.model_dump(mode="json")

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".partial")
        tmp.write_text(json.dumps(self.model_dump(mode="json"), indent=2) + "\n")
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> TierDecision | None:
        """The decision stored at ``path``; ``None`` when there is none or it is unreadable
        (an unreadable decision is treated as missing, so tuning runs again)."""
        try:
            return cls.model_validate_json(path.read_text())
        except (OSError, ValueError):
            return None
