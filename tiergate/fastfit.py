"""The local stack's fast tier, fitted beside a gateway that already serves (issue 53).

``tiergate up`` serves as soon as the standard engine answers; :class:`FastTierFitter`
then does in a thread of its own what the stack did before it opened: the tuner's decision
(measured now by ``tiergate tune`` in a child process when none holds for this machine,
its progress in the tuner's progress file), the checkpoint, the fast engine, its parity
judged where it never was, the one-or-two-engines layout where the tiers share engines.
When all of it holds, the fast tier joins the running gateway (tiergate.fitting); when any
of it fails, the stack keeps serving with the standard tier answering the fast tier's
requests (``unfitted``), and says why.

Stopping (:meth:`FastTierFitter.stop`) ends the tuning child (which stops the candidate
engines it started: SIGTERM is its Ctrl-C) and the engines this fitter started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from tiergate.engine.process import Engine, healthy, start_vllm, wait_ready
from tiergate.enginesettings import TierProfile
from tiergate.evidence import TierDecision
from tiergate.fitting import Fitting, Joined
from tiergate.local.supervisor import Child, Supervisor, kill_leftovers
from tiergate.settings import Settings
from tiergate.tiers import Tier
from tiergate.tuning.layout import EngineLayout, ensure_layout, serves_one, stored_layout
from tiergate.tuning.plan import Plan, Waiting, tier_plan
from tiergate.tuning.tuner import current_decision

Say = Callable[[str], None]
# How long the tuning child has to stop its candidate engines after SIGTERM.
_TUNING_STOP_SECONDS = 60.0


def say_up(message: str) -> None:
    print(f"[tiergate up] {message}", file=sys.stderr, flush=True)


def verify_fast_tier(plan: Plan, urls: dict[Tier, str], say: Say = say_up) -> None:
    """A quantized fast tier never judged (the plan let it start for that) is judged once,
    now that both tiers run; a failing one is not served."""
    from tiergate.engine.gate import REPORT
    from tiergate.quant.parity import Endpoint, evaluate, write_report

    if not plan.judge_once_started:
        return
    checkpoint = Path(plan.profile.model)
    name = plan.profile.served_model_name
    say("judging the fast tier's parity with the standard tier (once, a few minutes)")
    report = evaluate(
        Endpoint(urls[Tier.STANDARD], name), Endpoint(urls[Tier.FAST], name), progress=say
    )
    write_report(report, checkpoint, f"{checkpoint.name} vs standard")
    if not report["passed"]:
        raise RuntimeError(f"the fast tier failed its parity check: {checkpoint / REPORT}")
    say(f"parity passed: {checkpoint / 'parity-report.md'}")


def announce(decision: TierDecision, say: Say = say_up) -> None:
    """What the tuner's decision makes the fast tier run, said before it starts."""
    say(
        f"fast tier: {decision.recipe_name} ({decision.verdict}; "
        + ", ".join(f"{v:.2f}x at concurrency {k}" for k, v in decision.speedup.items())
        + f"), decided on {decision.fingerprint['cpu']}"
    )
    if decision.verdict == "equal":
        say(f"this hardware has no faster recipe: {decision.reason}")


def one_pool(settings: Settings, decision: TierDecision | None, fast: TierProfile) -> bool:
    """Whether the tiers serve as one pool: the fast tier runs the standard configuration
    itself (verdict ``equal``, no recipe), the same weights and capabilities, and
    tuning.share_engines_when_equal is on."""
    standard = settings.profiles[Tier.STANDARD]
    return (
        settings.tuning.share_engines_when_equal
        and decision is not None
        and decision.verdict == "equal"
        and decision.chosen is None
        and fast.speculative is None
        and fast.quantize is None
        and fast.model == standard.model
    )


def shared_pools(
    settings: Settings,
    decision: TierDecision | None,
    fast: TierProfile,
    urls: dict[Tier, str],
    layout: EngineLayout | None = None,
) -> Settings:
    """Both tiers' pools for :func:`one_pool`: both engines, so that neither idles while the
    other queues, or the standard engine alone where the measured ``layout`` says a second
    engine adds nothing on this machine. Otherwise each tier keeps its own engine."""
    if not one_pool(settings, decision, fast):
        return settings
    if serves_one(layout):
        pools = {Tier.STANDARD: [urls[Tier.STANDARD]], Tier.FAST: [urls[Tier.STANDARD]]}
    else:
        both = [urls[Tier.STANDARD], urls[Tier.FAST]]
        pools = {Tier.STANDARD: both, Tier.FAST: both[::-1]}
    tiers = {
        tier: pool.model_copy(update={"endpoints": pools[tier]})
        for tier, pool in settings.tiers.items()
    }
    return settings.model_copy(update={"tiers": tiers})


def say_layout(layout: EngineLayout, reused: bool = False, say: Say = say_up) -> None:
    import time

    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(layout.measured_at))
    figures = ("as measured " + when + ", " if reused else "") + (
        f"{layout.concurrency} requests split over two engines gave "
        f"{layout.two_engines_tokens_per_s:.1f} output tokens/s against "
        f"{layout.one_engine_tokens_per_s:.1f} on one ({layout.ratio:.2f}x)"
    )
    if layout.engines == "one":
        not_started = "; the fast engine is not started" if reused else ""
        say(f"no faster recipe here, and {figures}: one engine serves both tiers{not_started}")
    else:
        say(f"no faster recipe here, and {figures}: both engines serve both tiers")


def start_engine(tier: Tier, profile: TierProfile, log_dir: Path, say: Say = say_up) -> Engine:
    url = f"http://{profile.host}:{profile.port}"
    log = log_dir / f"vllm-{tier.value}.log"
    if healthy(url):
        say(f"{tier.value} tier already running at {url}; reusing it")
        return Engine(tier.value, url, profile.served_model_name, None, log)
    say(f"starting the {tier.value} tier on {url} (log: {log})")
    return Engine(tier.value, url, profile.served_model_name, start_vllm(profile, log), log)


def supervise_engine(supervisor: Supervisor, engine: Engine, profile: TierProfile) -> Child | None:
    """Restart an engine this stack started when it dies; ``engine.proc`` follows."""
    if engine.proc is None:  # reused, not ours to restart
        return None

    def restart() -> subprocess.Popen[bytes]:
        if engine.proc is not None:
            kill_leftovers(engine.proc)
        engine.proc = start_vllm(profile, engine.log)
        return engine.proc

    return supervisor.watch(f"{engine.name} engine", engine.proc, restart, engine.log)


class Stopped(Exception):
    """The stack is stopping: the fitting ends where it stands."""


class FastTierFitter:
    """Fits the fast tier in a thread of its own and has the gateway take it in."""

    def __init__(
        self,
        settings: Settings,
        standard: Engine,
        fitting: Fitting,
        supervisor: Supervisor,
        log_dir: Path,
        *,
        eager_engines: bool = False,
        say: Say = say_up,
    ) -> None:
        self._settings = settings
        self._standard = standard
        self._fitting = fitting
        self._supervisor = supervisor
        self._log_dir = log_dir
        self._eager = eager_engines
        self._say = say
        self._lock = threading.Lock()
        self._stopping = False
        self._tuning: subprocess.Popen[bytes] | None = None
        self.engines: list[Engine] = []  # what this fitter started, stopped with it
        self._watched: list[Child] = []
        self._thread = threading.Thread(target=self._run, name="tiergate-fitting", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wait(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def stop(self) -> None:
        """End the tuning child and stop the engines this fitter started (after the
        supervisor has stopped: nothing is restarted). An engine the thread starts from
        here on is stopped by the thread itself (:meth:`_started`)."""
        with self._lock:
            self._stopping = True
            tuning = self._tuning
        if tuning is not None and tuning.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                tuning.send_signal(signal.SIGTERM)
            try:
                tuning.wait(_TUNING_STOP_SECONDS)
            except subprocess.TimeoutExpired:
                tuning.kill()
                tuning.wait()
        self._stop_engines()
        self._thread.join(30)  # its next step sees the flag (and finds its engines gone)
        self._stop_engines()

    def _stop_engines(self) -> None:
        with self._lock:
            engines, self.engines = list(self.engines), []
        for engine in engines:
            if engine.proc is not None and engine.proc.poll() is None:
                self._say(f"stopping the {engine.name} tier")
                engine.stop()

    # -- the thread --------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._fit()
        except Stopped:
            return
        # Any failure leaves the standard tier serving both; SystemExit too (a checkpoint
        # build that could not run says so that way), which a thread would swallow unsaid.
        except (Exception, SystemExit) as exc:
            if self._stopping:
                return
            for child in self._watched:  # an engine that will not serve is not kept up
                self._supervisor.unwatch(child)
            self._stop_engines()
            reason = str(exc).splitlines()[0][:500] if str(exc) else type(exc).__name__
            self._fitting.fail(reason)
            self._say(
                f"the fast tier will not join: {reason}; the standard tier serves its "
                "requests (x-tiergate-tier-reason: unfitted)"
            )

    def _check(self) -> None:
        if self._stopping:
            raise Stopped

    def _started(self, engine: Engine) -> Engine:
        with self._lock:
            stopping = self._stopping
            if not stopping:
                self.engines.append(engine)
        if stopping:  # the stack stopped while it started: not left running
            engine.stop()
            raise Stopped
        return engine

    def _tune(self) -> None:
        """``tiergate tune`` in a child of its own, against the serving standard engine:
        stoppable as a whole (its engines stop with it), its progress on stderr and in the
        tuner's progress file."""
        env = dict(os.environ)
        if self._eager:
            for tier in Tier:
                env[f"TIERGATE_PROFILES__{tier.value.upper()}__ENFORCE_EAGER"] = "true"
        command = [sys.executable, "-m", "tiergate", "tune", "--standard-url", self._standard.url]
        with contextlib.suppress(OSError):  # an earlier tuning's figures are not this one's
            self._settings.tuning.progress_path().unlink()
        with self._lock:
            self._check()
            self._tuning = subprocess.Popen(
                command, env=env, stdout=subprocess.DEVNULL, start_new_session=True
            )
        code = self._tuning.wait()
        self._check()
        if code != 0:
            raise RuntimeError(f"the tuning exited with code {code} (its lines above say why)")
        if current_decision(self._settings) is None:
            raise RuntimeError("the tuning ended without a decision for this machine")

    def _fit(self) -> None:
        settings, standard, say = self._settings, self._standard, self._say
        if settings.profiles[Tier.FAST].tuned and current_decision(settings) is None:
            self._fitting.enter("tuning", "measuring the candidate recipes on this machine")
            say(
                "the gateway serves meanwhile; the fast tier's requests go to the standard "
                "tier (x-tiergate-tier-reason: fitting) until it joins"
            )
            self._tune()
        self._fitting.enter("starting", "building and starting the fast tier's engine")
        plan = tier_plan(
            settings,
            standard_url=standard.url,
            progress=say,
            announce=lambda d: announce(d, say),
            prepare=True,
            parity="once started",
        )
        if isinstance(plan, Waiting):
            raise RuntimeError(plan.reason)
        self._check()
        standard_profile = settings.profiles[Tier.STANDARD]
        fast_url = f"http://{plan.profile.host}:{plan.profile.port}"
        pooled = one_pool(settings, plan.decision, plan.profile)
        layout = stored_layout(settings) if pooled else None
        fast: Engine | None = None
        if serves_one(layout) and not healthy(fast_url):
            say_layout(layout, reused=True, say=say)  # measured before: one engine serves
        else:
            fast = self._started(start_engine(Tier.FAST, plan.profile, self._log_dir, say))
            wait_ready([fast], progress=say)
            self._check()
            if pooled:
                layout = ensure_layout(
                    settings, standard.url, fast.url, standard_profile.served_model_name, say
                )
                say_layout(layout, say=say)
            if serves_one(layout) and fast.proc is not None:
                fast.stop()  # its core goes to the standard engine's own processes
                self.engines.remove(fast)
                fast = None
            if fast is not None:
                child = supervise_engine(self._supervisor, fast, plan.profile)
                if child is not None:
                    self._watched.append(child)
                self._fitting.enter("judging", "judging the fast tier's parity")
                verify_fast_tier(plan, {Tier.STANDARD: standard.url, Tier.FAST: fast.url}, say)
        self._check()
        serving = fast if fast is not None else standard
        modes: dict[Tier, str] = {}
        if serving.proc is not None:
            profile = plan.profile if serving is fast else standard_profile
            modes[Tier.FAST] = profile.engine_mode
        pools = shared_pools(
            settings,
            plan.decision,
            plan.profile,
            {Tier.STANDARD: standard.url, Tier.FAST: fast_url},
            layout,
        ).tiers
        endpoints = {tier: list(pools[tier].endpoints) for tier in Tier}
        listed = [set(endpoints[Tier.STANDARD]), set(endpoints[Tier.FAST])]
        self._fitting.join(
            Joined(
                endpoints=endpoints,
                engine_modes=modes,
                shared_engines=bool(listed[0]) and listed[0] == listed[1],
                engine_count=len(listed[0] | listed[1]),
            )
        )
        say(f"the fast tier joins the gateway: {', '.join(endpoints[Tier.FAST])}")
