"""``tiergate tune``: measure every candidate recipe against the standard tier on this
machine, judge the parity of those that could win, and write the decision.

One standard engine runs throughout (on the standard tier's cores); each candidate runs in
turn on the fast tier's cores, as it would serve. A candidate is judged for parity only if
passing would make it the choice (:func:`worth_judging`). A candidate is not started when
the budget left is shorter than the longest start-and-measure so far, and not judged when
it is shorter than the longest judgement so far: the first tuning is bounded, what was left
out is listed as such, and a reuse (same fingerprint, same inputs) costs a file read.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx

from tiergate.engine.kernels import (
    REQUIRED_OPS,
    ProbeFailed,
    missing_drafter,
    missing_kernel,
    present_ops,
)
from tiergate.engine.process import Engine, EngineFailed, launched
from tiergate.enginesettings import Recipe, TierProfile
from tiergate.evidence import CandidateResult, ParitySummary, TierDecision
from tiergate.fitting import write_progress
from tiergate.measure.fingerprint import digest, hardware_fingerprint
from tiergate.measure.ports import free_ports
from tiergate.measure.quiet import QuietWatch
from tiergate.quant.parity import (
    Endpoint,
    ParityThresholds,
    evaluate,
    summary,
    task_subset,
    write_report,
)
from tiergate.quant.prepare import prepare_profile_model
from tiergate.settings import Settings
from tiergate.speculative.measure import acceptance_between, spec_counters
from tiergate.tiers import Tier
from tiergate.tuning.decide import (
    BEHIND_A_PROVEN_RECIPE,
    Choice,
    choose,
    judge_next,
    worth_judging,
)
from tiergate.tuning.profiles import recipe_profile
from tiergate.tuning.report import render_decision
from tiergate.tuning.served import AsServed, mode_of, screening_settings, standard_engine
from tiergate.tuning.speed import measure_speed

Progress = Callable[[str], None]

# Until measured in this run: an eager start with the speed rounds, and one parity run.
_MEASURE_ESTIMATE_SECONDS = 150.0
_PARITY_ESTIMATE_SECONDS = 240.0
_AS_SERVED_ESTIMATE_SECONDS = 200.0


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def inputs_digest(settings: Settings) -> str:
    """What the decision answers for besides the hardware: the standard checkpoint, the
    candidates, the thresholds and the way speed is measured."""
    standard = settings.profiles[Tier.STANDARD]
    # What serves the decision, not what it measures, is left out (a new such setting must
    # not make every installation tune again).
    serving = {
        "decision_file",
        "budget_seconds",
        "seconds_per_candidate",
        "share_engines_when_equal",
        "layout_concurrency",
        "two_engines_min_gain",
        "screen_eager",
    }
    tuning = settings.tuning.model_dump(mode="json", exclude=serving)
    return digest(
        {
            "standard": [standard.model, standard.dtype, standard.enforce_eager],
            "fast_eager": settings.profiles[Tier.FAST].enforce_eager,
            "screen_eager": settings.tuning.screen_eager,
            "tuning": tuning,
            "parity": ParityThresholds().model_dump(),
        }
    )


def current_decision(settings: Settings) -> TierDecision | None:
    """The stored decision if it holds for this machine and these inputs, else ``None``."""
    decision = TierDecision.load(settings.tuning.decision_path())
    if decision is None:
        return None
    if decision.fingerprint_digest != digest(hardware_fingerprint(settings.gpu_name)):
        return None
    if decision.inputs_digest != inputs_digest(settings):
        return None
    return decision


class Tuner:
    """One tuning run over the settings' candidates."""

    def __init__(self, settings: Settings, progress: Progress = print) -> None:
        self.settings = settings
        self.tuning = settings.tuning
        self.progress = progress
        self.thresholds = ParityThresholds()
        self.report_dir = self.tuning.decision_path().parent / "tuning"
        self._started = time.monotonic()
        self._measure_seconds = _MEASURE_ESTIMATE_SECONDS
        self._parity_seconds = _PARITY_ESTIMATE_SECONDS
        self._measured_once = self._judged_once = False
        # Where the tuning's time went (build, start, speed, parity, as served), in the
        # decision and its report; and the serving engines' quiet windows when it runs
        # beside them (a standard_url given: the local stack serving while it tunes).
        self.phase_seconds: dict[str, float] = {}
        self.quiet: QuietWatch | None = None
        self._starting = time.monotonic()

    @contextlib.contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            spent = time.monotonic() - started
            self.phase_seconds[name] = round(self.phase_seconds.get(name, 0.0) + spent, 1)

    def _left(self) -> float:
        return self.tuning.budget() - (time.monotonic() - self._started)

    def run(self, standard_url: str | None = None) -> TierDecision:
        """Screen every candidate (eager engines with ``tuning.screen_eager``), choose,
        measure the choice again as served when the screening mode differs, write the
        decision. ``standard_url``: a running standard engine of the serving mode."""
        self._started = started = time.monotonic()
        self.phase_seconds = {}
        self.quiet = QuietWatch([standard_url], self.progress) if standard_url else None
        fingerprint = hardware_fingerprint(self.settings.gpu_name)
        screen = screening_settings(self.settings)
        self.progress(
            f"tuning the fast tier on {fingerprint['cpu']} ({fingerprint['cores']} cores, "
            f"{fingerprint['isa']}); {len(self.tuning.candidates)} candidates, budget "
            f"{self.tuning.budget():.0f}s, screened with {mode_of(screen)} engines"
        )
        logs = self.settings.cache_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        results: list[CandidateResult] = []
        reuse = standard_url if screen is self.settings else None
        kernels = self._kernels()
        self._report_progress(0, results)
        with ExitStack() as stack:
            standard: Engine | None = None  # started for the first candidate that runs
            for index, recipe in enumerate(self.tuning.candidates, 1):
                self._report_progress(index, results)
                unrunnable = missing_kernel(recipe.quantize, kernels) or missing_drafter(
                    recipe.speculative
                )
                if unrunnable is not None:
                    self.progress(f"[{index}] {recipe.name}: skipped ({unrunnable})")
                    results.append(
                        CandidateResult(recipe=recipe, status="skipped", note=unrunnable)
                    )
                    continue
                if self._measure_seconds > self._left():
                    why = (
                        f"tuning budget: {max(0.0, self._left()):.0f} s left of "
                        f"{self.tuning.budget():.0f}, a candidate took up to "
                        f"{self._measure_seconds:.0f} s"
                    )
                    self.progress(f"[{index}] {recipe.name}: skipped ({why})")
                    results.append(CandidateResult(recipe=recipe, status="skipped", note=why))
                    continue
                if standard is None:
                    standard = stack.enter_context(
                        standard_engine(screen, reuse, logs, self.progress)
                    )
                self.progress(f"[{index}/{len(self.tuning.candidates)}] {recipe.name}")
                results.append(self._candidate(recipe, standard, results, logs, screen))
        if screen is not self.settings:
            self._report_progress(len(self.tuning.candidates) + 1, results)
            with self._phase("as served"):
                results = self._confirm(results, standard_url, logs, screen)
        decision = self._decide(results, fingerprint, time.monotonic() - started)
        self._report_progress(len(self.tuning.candidates) + 2, results)
        path = self.tuning.decision_path()
        decision.save(path)
        path.with_suffix(".md").write_text(render_decision(decision))
        self.progress(f"decision: {decision.recipe_name} ({decision.verdict}): {decision.reason}")
        return decision

    def _report_progress(self, step: int, results: list[CandidateResult]) -> None:
        """The progress file (tiergate.fitting): candidate ``step`` of n under way (past n:
        the choice measured as served, then decided), the figures so far, and an estimate
        of what is left from the longest candidate and judgement seen yet."""
        total = len(self.tuning.candidates)
        confirming = step == total + 1
        proven = sum(1 for r in results if r.parity is not None and r.parity.passed)
        # Each proven recipe is measured again as served (a compiled start, the rounds):
        # about 200 s each on a 2-core AMD EPYC Zen 4 (181-210 s, 2026-12-07).
        served = _AS_SERVED_ESTIMATE_SECONDS if self.tuning.screen_eager else 0.0
        if step > total + 1:
            left = 0.0
        elif confirming:
            left = max(1, proven) * served
        else:
            remaining = max(0, total - step + (0 if step == 0 else 1))
            left = remaining * (self._measure_seconds + self._parity_seconds / 2)
            left += max(1, proven) * served
        current = (
            self.tuning.candidates[step - 1].name
            if 1 <= step <= total
            else "the choice, measured as served"
            if confirming
            else "decided"
            if step > total
            else "starting"
        )
        body = {
            "candidate": min(step, total),
            "of": total,
            "doing": current,
            "elapsed_seconds": round(time.monotonic() - self._started, 1),
            "estimated_seconds_left": round(min(left, max(0.0, self._left())), 0),
            "results": [
                {
                    "recipe": r.recipe.name,
                    # Before the decision a candidate's status is a placeholder: its parity
                    # says more.
                    "status": r.status
                    if r.parity is None
                    else ("passed parity" if r.parity.passed else "failed parity"),
                    "speedup": r.speedup,
                    "parity_passed": None if r.parity is None else r.parity.passed,
                }
                for r in results
            ],
        }
        # Progress is shown, not needed: a tuning that cannot write it goes on.
        with contextlib.suppress(OSError, ValueError):
            write_progress(self.tuning.progress_path(), body)

    def _confirm(
        self, results: list[CandidateResult], standard_url: str | None, logs: Path, screen: Settings
    ) -> list[CandidateResult]:
        """The choice measured as served (:class:`AsServed`); where that undid it, a
        candidate left unjudged only because the fallen recipe was ahead of it is judged
        now (eager, as screened) and the choice made again, until none is left that could
        change it."""
        served = AsServed(self.settings, standard_url, logs, self.progress, self.quiet)
        while True:
            results = served.confirm(results, self._choose)
            t = self.tuning
            index = judge_next(results, t.min_speedup, t.min_speedup_any_level, self._primary())
            if index is None:
                return results
            if self._parity_seconds > self._left():
                self.progress(f"  {results[index].recipe.name}: parity not judged (budget)")
                return results
            results[index] = self._judge_later(results[index], logs, screen)

    def _judge_later(
        self, result: CandidateResult, logs: Path, screen: Settings
    ) -> CandidateResult:
        """Parity for a candidate screened earlier, its engine started again."""
        recipe = result.recipe
        self.progress(
            f"[again] {recipe.name}: the recipe ahead of it fell short as served; judging "
            "its parity"
        )
        fast = screen.profiles[Tier.FAST]
        try:
            profile = recipe_profile(fast, recipe, self.settings.profiles[Tier.STANDARD].model)
            prepare_profile_model(profile, self.settings)
            profile = profile.model_copy(update={"port": free_ports()[0]})
            with (
                standard_engine(screen, None, logs, self.progress) as standard,
                launched(
                    recipe.name,
                    profile,
                    logs / f"tune-{_slug(recipe.name)}.log",
                    progress=self.progress,
                ) as engine,
            ):
                judged = self._judge(recipe, profile, standard, engine, result)
        except (SystemExit, EngineFailed, RuntimeError, OSError, httpx.HTTPError) as exc:
            self.progress(f"  {recipe.name}: {exc}")
            return result.model_copy(update={"status": "error", "note": str(exc)[:500]})
        return judged.model_copy(update={"note": "judged once the recipe ahead fell short"})

    def _kernels(self) -> dict[str, bool]:
        """Which quantized kernels this processor's engine has (tiergate.engine.kernels);
        nothing known (every candidate tried) when the probe itself fails."""
        schemes = {r.quantize for r in self.tuning.candidates if r.quantize is not None}
        try:
            return present_ops(REQUIRED_OPS[s] for s in schemes if s in REQUIRED_OPS)
        except ProbeFailed as exc:
            self.progress(f"  {exc}; every candidate is tried")
            return {}

    def _candidate(
        self,
        recipe: Recipe,
        standard: Engine,
        earlier: list[CandidateResult],
        logs: Path,
        screen: Settings,
    ) -> CandidateResult:
        fast = screen.profiles[Tier.FAST]
        t0 = time.monotonic()
        try:
            profile = recipe_profile(fast, recipe, self.settings.profiles[Tier.STANDARD].model)
            with self._phase("build"):
                prepare_profile_model(profile, self.settings)
        except (SystemExit, OSError, RuntimeError) as exc:
            return CandidateResult(recipe=recipe, status="error", note=f"build failed: {exc}")
        profile = profile.model_copy(update={"port": free_ports()[0]})
        self._starting = time.monotonic()  # the engine's start, its build done
        try:
            with launched(
                recipe.name,
                profile,
                logs / f"tune-{_slug(recipe.name)}.log",
                progress=self.progress,
            ) as engine:
                return self._measure(recipe, profile, standard, engine, earlier, t0)
        except (EngineFailed, RuntimeError, OSError, httpx.HTTPError) as exc:
            # One candidate failing (an engine that does not start or answers errors) is a
            # finding about that recipe on this hardware, not the end of the tuning.
            self.progress(f"  {recipe.name}: {exc}")
            return CandidateResult(recipe=recipe, status="error", note=str(exc)[:500])

    def _measure(
        self,
        recipe: Recipe,
        profile: TierProfile,
        standard: Engine,
        engine: Engine,
        earlier: list[CandidateResult],
        launched_at: float,
    ) -> CandidateResult:
        before = spec_counters(httpx.get(f"{engine.url}/metrics", timeout=10).text)
        self.phase_seconds["start"] = round(
            self.phase_seconds.get("start", 0.0) + time.monotonic() - self._starting, 1
        )
        with self._phase("speed"):
            speed = measure_speed(
                standard.url,
                engine.url,
                engine.model,
                self.tuning.levels,
                self.tuning.requests_per_level,
                self.tuning.max_tokens,
                self.tuning.rounds,
                self.progress,
                self.quiet,
            )
        after = spec_counters(httpx.get(f"{engine.url}/metrics", timeout=10).text)
        self._note_measure(time.monotonic() - launched_at)
        result = CandidateResult(
            recipe=recipe,
            status="too slow",
            speedup=speed.speedup,
            tpot_ms=speed.candidate_tpot_ms,
            standard_tpot_ms=speed.standard_tpot_ms,
            acceptance_rate=acceptance_between(before, after).rate if recipe.speculative else None,
        )
        if not worth_judging(
            result,
            earlier,
            self.tuning.min_speedup,
            self.tuning.min_speedup_any_level,
            self._primary(),
        ):
            slowest = min(result.speedup, key=lambda k: result.speedup[k])
            why = (
                f"slower than standard at concurrency {slowest}"
                if result.speedup[slowest] < self.tuning.min_speedup_any_level
                else BEHIND_A_PROVEN_RECIPE
            )
            self.progress(f"  {recipe.name}: {why}; parity not judged")
            return result.model_copy(update={"note": why})
        if self._parity_seconds > self._left():
            self.progress(f"  {recipe.name}: parity not judged (budget)")
            return result.model_copy(
                update={"status": "skipped", "note": "parity not judged: tuning budget"}
            )
        return self._judge(recipe, profile, standard, engine, result)

    def _judge(
        self,
        recipe: Recipe,
        profile: TierProfile,
        standard: Engine,
        engine: Engine,
        result: CandidateResult,
    ) -> CandidateResult:
        """``result`` with the parity of ``engine`` (running ``recipe``) against
        ``standard``, its report written beside the decision (and the checkpoint)."""
        self.progress(f"  {recipe.name}: judging parity")
        judged_at = time.monotonic()
        with self._phase("parity"):
            report = evaluate(
                Endpoint(standard.url, standard.model),
                Endpoint(engine.url, engine.model),
                self.thresholds,
                progress=lambda m: self.progress(f"  parity: {m}"),
                tasks=task_subset(self.tuning.parity_max_tasks),
            )
        self._note_parity(time.monotonic() - judged_at)
        folder = self.report_dir / _slug(recipe.name)
        write_report(report, folder, f"{recipe.name} vs standard")
        if report["passed"] and recipe.quantize is not None:
            # The launch gate reads the report beside the checkpoint it guards.
            write_report(report, Path(profile.model), f"{recipe.name} vs standard")
        self.progress(
            f"  parity {'passed' if report['passed'] else 'FAILED'}: {folder / 'parity-report.md'}"
        )
        return result.model_copy(update={"parity": ParitySummary(**summary(report))})

    def _note_measure(self, seconds: float) -> None:
        first = not self._measured_once
        self._measure_seconds = seconds if first else max(self._measure_seconds, seconds)
        self._measured_once = True

    def _note_parity(self, seconds: float) -> None:
        first = not self._judged_once
        self._parity_seconds = seconds if first else max(self._parity_seconds, seconds)
        self._judged_once = True

    def _primary(self) -> str:
        return str(min(self.tuning.levels))

    def _choose(self, results: list[CandidateResult]) -> Choice:
        return choose(
            results, self.tuning.min_speedup, self.tuning.min_speedup_any_level, self._primary()
        )

    def _decide(
        self, results: list[CandidateResult], fingerprint: dict[str, str], seconds: float
    ) -> TierDecision:
        choice = self._choose(results)
        marked = []
        for r in results:
            status = r.status
            if choice.recipe is not None and r.recipe == choice.recipe:
                status = "chosen"
            elif r.parity is not None:
                status = "passed" if r.parity.passed else "failed parity"
            marked.append(r.model_copy(update={"status": status}))
        served = mode_of(self.settings)
        screened = mode_of(screening_settings(self.settings))
        return TierDecision(
            fingerprint=fingerprint,
            fingerprint_digest=digest(fingerprint),
            inputs_digest=inputs_digest(self.settings),
            decided_at=time.time(),
            seconds=round(seconds, 1),
            engine_mode=served,
            screening_mode=screened if screened != served else None,
            chosen=choice.recipe,
            verdict=choice.verdict,
            reason=choice.reason,
            speedup=choice.speedup,
            candidates=marked,
            phase_seconds=dict(self.phase_seconds),
            rounds_measured_again=self.quiet.repeated if self.quiet is not None else 0,
        )


def ensure_decision(
    settings: Settings, progress: Progress = print, standard_url: str | None = None
) -> TierDecision:
    """The valid decision for this machine: reused when it matches, else tuned now."""
    decision = current_decision(settings)
    if decision is not None:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(decision.decided_at))
        progress(
            f"reusing the tier decision of {when} for this hardware: "
            f"{decision.recipe_name} ({decision.verdict})"
        )
        return decision
    stored = TierDecision.load(settings.tuning.decision_path())
    if stored is not None:
        progress("the stored tier decision was made on other hardware or inputs; tuning again")
    return Tuner(settings, progress).run(standard_url)
