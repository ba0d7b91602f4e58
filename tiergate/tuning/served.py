"""Screening in one engine mode, serving in another: the tuner's choice measured as served.

On CPU a compiled engine's first start costs minutes per configuration (the compile; later
starts load its cache), an eager one under a minute. The tuner therefore screens every
candidate with eager engines (``tuning.screen_eager``) and, when the tiers serve compiled,
measures the recipe it would choose again with compiled engines, against a compiled
standard engine, before the decision is written. A recipe whose speedup does not hold as
served is not chosen: the choice is made again with its served figures, and the next
recipe it lands on is measured the same way, until the choice is one measured as served or
the standard configuration itself. Parity is a property of the weights and the sampler,
not of the engine mode, so it is not judged again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Literal

import httpx

from tiergate.engine.process import Engine, EngineFailed, launched
from tiergate.enginesettings import Recipe
from tiergate.evidence import CandidateResult
from tiergate.measure.ports import free_ports
from tiergate.measure.quiet import QuietWatch
from tiergate.settings import Settings
from tiergate.tiers import Tier
from tiergate.tuning.decide import Choice
from tiergate.tuning.profiles import recipe_profile
from tiergate.tuning.speed import measure_speed

Progress = Callable[[str], None]
Mode = Literal["eager", "compiled"]


def mode_of(settings: Settings) -> Mode:
    """The engine mode of the fast tier's profile (the one candidates run in)."""
    return settings.profiles[Tier.FAST].engine_mode


def screening_settings(settings: Settings) -> Settings:
    """The settings candidates are screened with: ``settings`` itself when the screening
    mode is the serving mode, else a copy whose engines run eager."""
    profiles = settings.profiles
    eager = all(p.enforce_eager for p in profiles.values())
    if not settings.tuning.screen_eager or eager:
        return settings
    screened = {tier: p.model_copy(update={"enforce_eager": True}) for tier, p in profiles.items()}
    return settings.model_copy(update={"profiles": screened})


@contextmanager
def standard_engine(
    settings: Settings, url: str | None, logs: Path, progress: Progress
) -> Iterator[Engine]:
    """The standard engine at ``url``, or one started for the block on its tier's cores."""
    profile = settings.profiles[Tier.STANDARD]
    if url is not None:
        yield Engine("standard", url.rstrip("/"), profile.served_model_name, None)
        return
    profile = profile.model_copy(update={"port": free_ports()[0]})
    mode = profile.engine_mode
    progress(f"starting the standard engine ({mode}) on cores {profile.cpu_cores}")
    log = logs / f"tune-standard-{mode}.log"
    with launched("standard", profile, log, progress=progress) as engine:
        yield engine


class AsServed:
    """Measures chosen recipes again in the serving mode (``settings``' own)."""

    def __init__(
        self,
        settings: Settings,
        standard_url: str | None,
        logs: Path,
        progress: Progress,
        quiet: QuietWatch | None = None,
    ) -> None:
        self.settings = settings
        self.standard_url = standard_url
        self.logs = logs
        self.progress = progress
        self.quiet = quiet

    def confirm(
        self, results: list[CandidateResult], choose: Callable[[list[CandidateResult]], Choice]
    ) -> list[CandidateResult]:
        """``results`` with the served figures of every recipe that passed parity, and of
        every recipe the choice then lands on, until it lands on one measured as served (or
        on none).

        Every proven recipe is measured as served, not only the screening's choice: the
        eager screening's noise once put INT8 alone (1.56x) ahead of INT8 with ngram at
        batch 1 (1.40x) where the next tuning measured 1.55x and 1.76x, and compiled, the
        ngram recipe served at 2.22x; measuring only the screening's choice made the
        decision follow that noise."""
        results = list(results)
        with ExitStack() as stack:
            standard: Engine | None = None
            for index, result in enumerate(results):
                if result.parity is None or not result.parity.passed or result.screened_speedup:
                    continue
                if standard is None:
                    standard = stack.enter_context(
                        standard_engine(self.settings, self.standard_url, self.logs, self.progress)
                    )
                results[index] = self._measure(result, standard)
            while (recipe := choose(results).recipe) is not None:
                index = next(i for i, r in enumerate(results) if r.recipe == recipe)
                if results[index].screened_speedup:
                    break  # measured as served already: the choice holds
                if standard is None:
                    standard = stack.enter_context(
                        standard_engine(self.settings, self.standard_url, self.logs, self.progress)
                    )
                results[index] = self._measure(results[index], standard)
        return results

    def _measure(self, screened: CandidateResult, standard: Engine) -> CandidateResult:
        recipe: Recipe = screened.recipe
        mode = mode_of(self.settings)
        self.progress(f"measuring {recipe.name} again as the tiers serve it ({mode} engines)")
        fast = self.settings.profiles[Tier.FAST]
        profile = recipe_profile(fast, recipe, self.settings.profiles[Tier.STANDARD].model)
        profile = profile.model_copy(update={"port": free_ports()[0]})
        log = self.logs / f"tune-served-{recipe.name.lower().replace(' ', '')}.log"
        started = time.monotonic()
        try:
            with launched(recipe.name, profile, log, progress=self.progress) as engine:
                t = self.settings.tuning
                speed = measure_speed(
                    standard.url,
                    engine.url,
                    engine.model,
                    t.levels,
                    t.requests_per_level,
                    t.max_tokens,
                    t.rounds,
                    self.progress,
                    self.quiet,
                )
        except (EngineFailed, RuntimeError, OSError, httpx.HTTPError) as exc:
            self.progress(f"  {recipe.name} as served: {exc}")
            note = f"failed as served ({mode}): {str(exc)[:300]}"
            # No served figures: the choice cannot rest on it (decide: nowhere slower).
            return screened.model_copy(
                update={
                    "status": "error",
                    "note": note,
                    "speedup": {},
                    "screened_speedup": screened.speedup,
                }
            )
        self.progress(f"  measured as served in {time.monotonic() - started:.0f} s")
        return screened.model_copy(
            update={
                "speedup": speed.speedup,
                "tpot_ms": speed.candidate_tpot_ms,
                "standard_tpot_ms": speed.standard_tpot_ms,
                "screened_speedup": screened.speedup,
            }
        )
