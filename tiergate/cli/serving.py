"""``tiergate serve``, ``backend``, ``tune``, ``worker`` and ``up``: the commands that run
the gateway, the engines and the workers (registered on the root app in __init__.py)."""

from __future__ import annotations

import os
import signal
from typing import Annotated

import typer
from pydantic import ValidationError

from tiergate.cli.common import settings_or_exit
from tiergate.measure.diskspace import STACK_MIN_FREE_GIB
from tiergate.settings import GatewaySettings
from tiergate.tiers import Tier


def serve(
    host: Annotated[str | None, typer.Option(help="Override gateway.host")] = None,
    port: Annotated[int | None, typer.Option(help="Override gateway.port")] = None,
    workers: Annotated[
        int,
        typer.Option(
            min=1,
            help="Gateway processes sharing the port (uvicorn workers); /metrics then adds "
            "up every process's counters (Prometheus multiprocess mode)",
        ),
    ] = 1,
) -> None:
    """Run the gateway."""
    import uvicorn

    from tiergate.gateway.app import create_app
    from tiergate.gateway.logs import configure_logging
    from tiergate.gateway.serving import uvicorn_options

    settings = settings_or_exit()
    # The options override the settings themselves: the metrics listener binds gateway.host.
    try:
        gateway = GatewaySettings.model_validate(
            {
                **settings.gateway.model_dump(),
                "host": host or settings.gateway.host,
                "port": port if port is not None else settings.gateway.port,
            }
        )
    except ValidationError as exc:
        typer.echo(f"tiergate: invalid --host/--port: {exc}", err=True)
        raise typer.Exit(2) from None
    settings = settings.model_copy(update={"gateway": gateway})
    configure_logging(settings.log_level)
    if workers == 1:
        uvicorn.run(
            create_app(settings),
            host=gateway.host,
            port=gateway.port,
            **uvicorn_options(gateway),
        )
        return
    from tiergate.gateway.workers import serve_workers

    serve_workers(settings, workers)


def backend(
    tier: Annotated[Tier, typer.Option(help="Which tier's profile to launch")],
    dry_run: Annotated[bool, typer.Option(help="Print the command and exit")] = False,
    skip_parity_check: Annotated[
        bool, typer.Option(help="Start a quantized checkpoint without a passing parity report")
    ] = False,
) -> None:
    """Launch vLLM for a tier from its profile (replaces this process). A tuned profile
    runs the recipe of this machine's tier decision (`tiergate tune`)."""
    from tiergate.engine.command import vllm_environment
    from tiergate.engine.gate import ParityMissing
    from tiergate.tuning.plan import Waiting, tier_plan

    settings = settings_or_exit()
    try:
        plan = tier_plan(settings, tier, parity="skip" if skip_parity_check else "required")
    except ParityMissing as exc:
        typer.echo(f"tiergate: {exc}", err=True)
        raise typer.Exit(3) from None
    if isinstance(plan, Waiting):
        typer.echo(
            "tiergate: no tier decision for this hardware; run `tiergate tune` first",
            err=True,
        )
        raise typer.Exit(3)
    cmd = plan.argv
    if dry_run:
        typer.echo(" ".join(cmd))
        return
    env = vllm_environment(plan.profile)
    api_key = settings.tiers[tier].api_key
    if api_key:
        env["VLLM_API_KEY"] = api_key  # vLLM's --api-key, kept off the command line
    os.execve(cmd[0], cmd, env)


def tune(
    force: Annotated[bool, typer.Option(help="Measure again even if the decision holds")] = False,
    budget: Annotated[
        float | None, typer.Option(help="Seconds at most (tuning.budget_seconds)")
    ] = None,
    standard_url: Annotated[
        str | None, typer.Option(help="Use this running standard-tier engine")
    ] = None,
) -> None:
    """Choose the fast tier on this hardware: measure each candidate recipe against the
    standard tier, judge parity, write the decision (reused while the hardware matches)."""
    from tiergate.tuning.tuner import Tuner, ensure_decision

    settings = settings_or_exit()
    if budget is not None:
        tuning = settings.tuning.model_copy(update={"budget_seconds": budget})
        settings = settings.model_copy(update={"tuning": tuning})

    def say(message: str) -> None:
        typer.echo(f"[tiergate tune] {message}", err=True)

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # the candidate engines are stopped on the way out

    # SIGTERM is how `tiergate up` stops a tuning it runs beside its gateway (fastfit.py).
    signal.signal(signal.SIGTERM, interrupted)

    if force:
        decision = Tuner(settings, say).run(standard_url)
    else:
        decision = ensure_decision(settings, say, standard_url)
    from tiergate.tuning.report import render_decision

    typer.echo(render_decision(decision))


def worker() -> None:
    """Run agent jobs from Kafka until SIGTERM (then drain)."""
    from tiergate.gateway.logs import configure_logging
    from tiergate.jobs.run.worker import Worker
    from tiergate.sandbox import LimitsUnavailable

    settings = settings_or_exit()
    configure_logging(settings.log_level)
    if not settings.jobs.enabled:
        typer.echo("tiergate: jobs.enabled is false; set TIERGATE_JOBS__ENABLED=true", err=True)
        raise typer.Exit(2)
    try:
        Worker(settings.jobs, serve_http=True).run_forever()
    except LimitsUnavailable as exc:
        typer.echo(f"tiergate worker: {exc}", err=True)
        raise typer.Exit(2) from None


def up(
    eager_engines: Annotated[
        bool,
        typer.Option(
            "--eager",
            help="eager engines: quicker first starts (no compile), slower serving",
        ),
    ] = False,
    jobs: Annotated[
        bool,
        typer.Option(
            "--jobs/--no-jobs",
            help="agent jobs: a durable object store (SeaweedFS), a broker (Tansu) and a "
            "worker beside the tiers",
        ),
    ] = True,
    default_environment: Annotated[
        bool,
        typer.Option(
            "--default-environment/--no-default-environment",
            help="build environments/default.yaml once (mmdebstrap, as root) and register it "
            "as the jobs' 'default' environment; --no-default-environment: jobs naming none "
            "run in the worker's own system",
        ),
    ] = True,
    min_free_gib: Annotated[
        float,
        typer.Option(
            "--min-free-gib",
            min=0,
            help="free disk space, in GiB above SeaweedFS's 1% floor, that each disk the "
            "stack writes must have to start (models, checkpoints, caches, job data)",
        ),
    ] = STACK_MIN_FREE_GIB,
) -> None:
    """Run the whole local stack: prepare the model, start the standard tier, choose the
    fast tier for this hardware (once), start it, warm both, serve the gateway."""
    from tiergate.local.environment import SHIPPED_MANIFEST
    from tiergate.stack import run_local_stack

    settings = settings_or_exit()
    code = run_local_stack(
        settings,
        eager_engines=eager_engines,
        jobs=jobs,
        default_environment=SHIPPED_MANIFEST if default_environment else None,
        min_free_gib=min_free_gib,
    )
    raise typer.Exit(code)
