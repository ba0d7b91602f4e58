"""The one-command local stack: embedded model, both tiers on vLLM-CPU, the gateway.

Order: the standard engine starts and warms up; the gateway then serves at once. The fast
tier is fitted beside it (tiergate.fastfit: the tuner's decision for this hardware, reused
when it matches and measured now when it does not, then its engine) and joins the running
gateway when it is proven; until then the standard tier serves its requests and says why
(``x-tiergate-tier-reason: fitting``), and ``GET /v1/tiers`` shows how far it is.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
from pathlib import Path

from tiergate.engine.process import Engine, EngineFailed, healthy, wait_ready
from tiergate.fastfit import FastTierFitter, say_up, start_engine, supervise_engine
from tiergate.fitting import Fitting
from tiergate.local.supervisor import Supervisor
from tiergate.measure.diskspace import (
    STACK_MIN_FREE_GIB,
    check_stack_disks,
    low_disk_message,
)
from tiergate.sandbox import LimitsUnavailable
from tiergate.settings import Settings
from tiergate.tiers import Tier

_say = say_up


def stack_paths(settings: Settings) -> list[Path]:
    """Where the local stack writes: its own cache (models, logs, the jobs' object store
    and broker, sandboxes), Hugging Face's and vLLM's caches (as those libraries resolve
    them: their variables are theirs), the temporary directory."""
    from huggingface_hub import constants

    vllm_cache = os.environ.get("VLLM_CACHE_ROOT") or str(Path.home() / ".cache" / "vllm")
    hub_cache = Path(constants.HF_HUB_CACHE)
    return [settings.cache_dir, hub_cache, Path(vllm_cache), Path(tempfile.gettempdir())]


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
    fitter: FastTierFitter | None = None

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
        standard = start_engine(Tier.STANDARD, standard_profile, log_dir, _say)
        engines.append(standard)
        wait_ready([standard], progress=_say)
        supervise_engine(supervisor, standard, standard_profile)
        fitting = Fitting(settings.tuning.progress_path())
        fast_profile = settings.profiles[Tier.FAST]
        fast_url = f"http://{fast_profile.host}:{fast_profile.port}"
        fast_found = healthy(fast_url)
        modes = {Tier.STANDARD: standard_profile.engine_mode} if standard.proc is not None else {}
        shown: dict[str, object] = {
            "engine_modes": {**modes, **settings.gateway.engine_modes},
            # The decision's evidence, shown once the fast tier has joined.
            "tier_evidence_file": str(settings.tuning.decision_path()),
        }
        gateway = settings.gateway.model_copy(update=shown)
        # Until the fast tier joins its pool is empty: the policy sends its requests to the
        # standard tier (a key that may use the fast tier alone is answered 503 meanwhile).
        tiers = {
            **settings.tiers,
            Tier.FAST: settings.tiers[Tier.FAST].model_copy(update={"endpoints": []}),
        }
        fitted_settings = settings
        settings = settings.model_copy(update={"gateway": gateway, "tiers": tiers})
        if (
            standard.proc is not None
            and not fast_found
            and all(p.scheduling_policy == "priority" for p in (standard_profile, fast_profile))
        ):
            # The engines this stack starts schedule by priority: the gateway sets it (an
            # engine found running may not, and would refuse a nonzero priority).
            policy = settings.policy.model_copy(update={"engine_priorities": True})
            settings = settings.model_copy(update={"policy": policy})
        fitter = FastTierFitter(
            fitted_settings,
            standard,
            fitting,
            supervisor,
            log_dir,
            eager_engines=eager_engines,
            say=_say,
        )
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
        fitter.start()
        uvicorn.run(
            create_app(settings, fitting), host=host, port=port, **uvicorn_options(settings.gateway)
        )
        return 0
    except KeyboardInterrupt:
        return 0
    except (RuntimeError, ParityMissing, EngineFailed, LimitsUnavailable) as exc:
        _say(f"error: {exc}")
        return 1
    finally:
        # Cleanup runs to its end: a second Ctrl-C (or SIGTERM) does not cut it short and
        # leave engines or the jobs' servers running.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        # First: nothing stopped from here on is restarted.
        supervisor.stop()
        if fitter is not None:
            fitter.stop()
        for engine in engines:
            if engine.proc is not None:
                _say(f"stopping the {engine.name} tier")
                engine.stop()
        pipeline.close()
