"""What a tier's engine runs, composed in one place: the tuner's decision (for a ``tuned``
profile) -> the profile -> the parity gate -> vLLM's command line.

``tiergate backend``, the local stack (``tiergate up``) and the chart's gate on the fast
tier's pods (``files/tier_decision.py``, run in the tuning image) each make one call, so all
three run the same recipe for the same decision and refuse the same checkpoints. What they
differ in is a parameter here: whether a missing decision is tuned now or waited for,
whether the checkpoint is built, and when an unjudged checkpoint is judged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tiergate.engine.command import vllm_command
from tiergate.engine.gate import MANIFEST, REPORT, ensure_parity
from tiergate.enginesettings import TierProfile
from tiergate.evidence import TierDecision
from tiergate.measure.fingerprint import digest, hardware_fingerprint
from tiergate.quant.prepare import prepare_profile_model
from tiergate.settings import Settings
from tiergate.tiers import Tier
from tiergate.tuning.profiles import decided_profile
from tiergate.tuning.tuner import Progress, current_decision, ensure_decision, inputs_digest

# "required": a quantized checkpoint without a passing parity report is refused (the launcher,
# the chart). "skip": told explicitly not to look (``--skip-parity-check``). "once started":
# a failing report is refused now, a missing one is judged beside the standard tier once
# both run (the local stack, which alone runs both).
ParityCheck = Literal["required", "skip", "once started"]


@dataclass(frozen=True)
class Plan:
    """A tier's engine as it will run: its profile, the decision it follows (``None``: the
    profile as configured) and whether its checkpoint is still to be judged for parity
    once started (only under ``"once started"``)."""

    profile: TierProfile
    decision: TierDecision | None = None
    judge_once_started: bool = False

    @property
    def argv(self) -> list[str]:
        """vLLM's command line for this engine."""
        return vllm_command(self.profile)

    def recipe_args(self) -> list[str]:
        """The checkpoint and the speculation of :attr:`argv` as ``--flag=value`` (what the
        chart's fast tier pods are handed); the profile's extra arguments are no recipe."""
        argv = self.argv
        recipe = argv[: len(argv) - len(self.profile.extra_args)]
        return [
            f"{flag}={recipe[recipe.index(flag) + 1]}"
            for flag in ("--model", "--speculative-config")
            if flag in recipe
        ]


@dataclass(frozen=True)
class Waiting:
    """No tier decision holds for this machine and these tuning inputs yet."""

    reason: str


def waiting_for(settings: Settings) -> str:
    """Why no decision holds here yet."""
    path = settings.tuning.decision_path()
    stored = TierDecision.load(path)
    if stored is None:
        return f"no tier decision at {path} yet (the tuning Job writes it)"
    here = hardware_fingerprint(settings.gpu_name)
    if stored.fingerprint_digest != digest(here):
        return f"the decision at {path} was measured on {stored.fingerprint}, this pod is {here}"
    if stored.inputs_digest != inputs_digest(settings):
        return f"the decision at {path} answers other tuning inputs (a new tuning is due)"
    return f"the decision at {path} does not hold"


def _unannounced(decision: TierDecision) -> None:
    pass


def tier_plan(
    settings: Settings,
    tier: Tier = Tier.FAST,
    *,
    standard_url: str | None = None,
    progress: Progress = print,
    announce: Callable[[TierDecision], None] = _unannounced,
    prepare: bool = False,
    parity: ParityCheck = "required",
) -> Plan | Waiting:
    """What ``tier`` runs on this machine (raises ``ParityMissing`` for a refused checkpoint).

    A ``tuned`` profile follows this machine's tier decision: without ``standard_url`` a
    missing one is :class:`Waiting`; with it, the tuner measures now against that running
    standard engine (saying so through ``progress``). ``announce`` hears the decision as
    soon as it is known, so a refusal is said after the decision it refuses. ``prepare``
    builds (or imports) the checkpoint when missing, before the gate looks at it.
    """
    profile = settings.profiles[tier]
    decision = None
    if profile.tuned:
        if standard_url is None:
            decision = current_decision(settings)
            if decision is None:
                return Waiting(waiting_for(settings))
        else:
            decision = ensure_decision(settings, progress, standard_url=standard_url)
        announce(decision)
        profile = decided_profile(profile, decision, settings.profiles[Tier.STANDARD].model)
    if prepare:
        prepare_profile_model(profile, settings)
    checkpoint = Path(profile.model)
    unjudged = (checkpoint / MANIFEST).is_file() and not (checkpoint / REPORT).is_file()
    later = parity == "once started" and unjudged
    ensure_parity(profile, skip=parity == "skip" or later)
    return Plan(profile, decision, judge_once_started=later)
