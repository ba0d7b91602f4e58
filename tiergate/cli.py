"""The ``tiergate`` command."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from pydantic import ValidationError

from tiergate.settings import (
    GatewaySettings,
    Settings,
    SettingsError,
    default_cache_dir,
    load_settings,
)
from tiergate.tiers import Tier

if TYPE_CHECKING:
    from collections.abc import Callable

    from tiergate.jobsclient import JobsClient
    from tiergate.settings import JobsSettings

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
model_app = typer.Typer(no_args_is_help=True, help="Prepare the embedded default model.")
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks that print figures and reports.")
app.add_typer(model_app, name="model")
keys_app = typer.Typer(no_args_is_help=True, help="API keys.")
app.add_typer(bench_app, name="bench")
app.add_typer(keys_app, name="keys")
quant_app = typer.Typer(no_args_is_help=True, help="Quantized checkpoints and their parity.")
spec_app = typer.Typer(no_args_is_help=True, help="Speculative decoding measurements.")
app.add_typer(quant_app, name="quant")
app.add_typer(spec_app, name="spec")
jobs_app = typer.Typer(
    no_args_is_help=True,
    help="Agent jobs on a gateway: submit, follow, list, cancel (tiergate.jobsclient).",
)
app.add_typer(jobs_app, name="jobs")
env_app = typer.Typer(no_args_is_help=True, help="Job environments.")
env_breaker_app = typer.Typer(
    no_args_is_help=True,
    help="Environments' circuit breakers in the job store (tiergate.queue.breaker).",
)
env_app.add_typer(env_breaker_app, name="breaker")
app.add_typer(env_app, name="env")


def _settings() -> Settings:
    try:
        return load_settings()
    except SettingsError as exc:
        typer.echo(f"tiergate: {exc}", err=True)
        raise typer.Exit(2) from None


@app.command()
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

    settings = _settings()
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


@app.command()
def backend(
    tier: Annotated[Tier, typer.Option(help="Which tier's profile to launch")],
    dry_run: Annotated[bool, typer.Option(help="Print the command and exit")] = False,
    skip_parity_check: Annotated[
        bool, typer.Option(help="Start a quantized checkpoint without a passing parity report")
    ] = False,
) -> None:
    """Launch vLLM for a tier from its profile (replaces this process). A tuned profile
    runs the recipe of this machine's tier decision (`tiergate tune`)."""
    from tiergate.engine.command import vllm_command, vllm_environment
    from tiergate.engine.gate import ParityMissing, ensure_parity

    settings = _settings()
    profile = settings.profiles[tier]
    if profile.tuned:
        from tiergate.tuning.profiles import decided_profile
        from tiergate.tuning.tuner import current_decision

        decision = current_decision(settings)
        if decision is None:
            typer.echo(
                "tiergate: no tier decision for this hardware; run `tiergate tune` first",
                err=True,
            )
            raise typer.Exit(3)
        profile = decided_profile(profile, decision, settings.profiles[Tier.STANDARD].model)
    try:
        ensure_parity(profile, skip=skip_parity_check)
    except ParityMissing as exc:
        typer.echo(f"tiergate: {exc}", err=True)
        raise typer.Exit(3) from None
    cmd = vllm_command(profile)
    if dry_run:
        typer.echo(" ".join(cmd))
        return
    env = vllm_environment(profile)
    api_key = settings.tiers[tier].api_key
    if api_key:
        env["VLLM_API_KEY"] = api_key  # vLLM's --api-key, kept off the command line
    os.execve(cmd[0], cmd, env)


@app.command()
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

    settings = _settings()
    if budget is not None:
        tuning = settings.tuning.model_copy(update={"budget_seconds": budget})
        settings = settings.model_copy(update={"tuning": tuning})

    def say(message: str) -> None:
        typer.echo(f"[tiergate tune] {message}", err=True)

    if force:
        decision = Tuner(settings, say).run(standard_url)
    else:
        decision = ensure_decision(settings, say, standard_url)
    from tiergate.tuning.report import render_decision

    typer.echo(render_decision(decision))


@app.command()
def worker() -> None:
    """Run agent jobs from Kafka until SIGTERM (then drain)."""
    from tiergate.gateway.logs import configure_logging
    from tiergate.queue.worker import Worker
    from tiergate.sandbox import LimitsUnavailable

    settings = _settings()
    configure_logging(settings.log_level)
    if not settings.jobs.enabled:
        typer.echo("tiergate: jobs.enabled is false; set TIERGATE_JOBS__ENABLED=true", err=True)
        raise typer.Exit(2)
    try:
        Worker(settings.jobs, serve_http=True).run_forever()
    except LimitsUnavailable as exc:
        typer.echo(f"tiergate worker: {exc}", err=True)
        raise typer.Exit(2) from None


@model_app.command("prepare")
def model_prepare(
    out: Annotated[Path | None, typer.Option(help="Checkpoint folder")] = None,
) -> None:
    """Convert the embedded SmolLM2 GGUF into a Hugging Face checkpoint (once)."""
    from tiergate.quant.convert import prepare_embedded_model
    from tiergate.settings import DEFAULT_MODEL_NAME

    target = out or default_cache_dir() / "models" / DEFAULT_MODEL_NAME
    prepare_embedded_model(target)


@app.command()
def up(
    compile_engines: Annotated[
        bool,
        typer.Option(
            "--compile",
            help="torch.compile both engines (slower starts; the tuning then compiles too)",
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
) -> None:
    """Run the whole local stack: prepare the model, start the standard tier, choose the
    fast tier for this hardware (once), start it, warm both, serve the gateway."""
    from tiergate.stack import run_local_stack

    settings = _settings()
    code = run_local_stack(settings, compile_engines=compile_engines, jobs=jobs)
    raise typer.Exit(code)


@bench_app.command("gateway")
def bench_gateway(
    out: Annotated[Path, typer.Option(help="Report folder")] = Path("reports"),
    duration: Annotated[float, typer.Option(help="Seconds per measurement")] = 10.0,
    repeat: Annotated[int, typer.Option(help="Runs; the report gives each figure's median")] = 3,
    workers: Annotated[
        str, typer.Option(help="tiergate process counts to measure, comma-separated")
    ] = "1",
) -> None:
    """Gateway overhead beside vllm-router and direct, against a zero-cost backend."""
    from tiergate.bench.gateway import run_gateway_benchmark

    counts = [int(w) for w in workers.split(",") if w.strip()]
    if 1 not in counts or repeat < 1:
        typer.echo("tiergate bench gateway: --workers must include 1; --repeat >= 1", err=True)
        raise typer.Exit(2)
    run_gateway_benchmark(out, duration, repeat=repeat, workers=counts)


@bench_app.command("limits")
def bench_limits(
    out: Annotated[Path, typer.Option(help="Report folder")] = Path("reports"),
    requests: Annotated[int, typer.Option(help="Requests per configuration")] = 5000,
) -> None:
    """Per-request cost of auth and limits, in-process and with Redis."""
    from tiergate.bench.limits import run_limits_benchmark

    run_limits_benchmark(out, requests)


@bench_app.command("sandbox")
def bench_sandbox(
    out: Annotated[Path, typer.Option(help="Report folder")] = Path("reports"),
    manifest: Annotated[Path, typer.Option(help="The environment to build and run in")] = Path(
        "environments/default.yaml"
    ),
    cold: Annotated[int, typer.Option(help="Jobs with the cache emptied first")] = 5,
    warm: Annotated[int, typer.Option(help="Jobs with the environment cached")] = 30,
    builds: Annotated[int, typer.Option(help="Builds of the manifest (2: check the digest)")] = 1,
) -> None:
    """Environment build time and pickup-to-first-command latency, cold and warm (needs
    root, mmdebstrap, bubblewrap and the local SeaweedFS); writes sandbox-bench.md/.json."""
    from tiergate.bench.sandbox import run_sandbox_benchmark

    run_sandbox_benchmark(out, manifest, cold, warm, max(1, builds))


@quant_app.command("build")
def quant_build(
    source: Annotated[Path | None, typer.Option(help="Standard-tier checkpoint")] = None,
    scheme: Annotated[list[str], typer.Option(help="W8A8 and/or W4A16")] = ["W8A8", "W4A16"],  # noqa: B006
    method: Annotated[str, typer.Option(help="rtn (no calibration) or gptq")] = "rtn",
    group_size: Annotated[int, typer.Option(help="W4A16 group size (must divide widths)")] = 64,
    out: Annotated[Path | None, typer.Option(help="Folder for the checkpoints")] = None,
) -> None:
    """Build INT8 (W8A8) and INT4 (W4A16) checkpoints with llm-compressor."""
    from tiergate.quant.build import build
    from tiergate.settings import DEFAULT_MODEL_NAME

    src = source or default_cache_dir() / "models" / DEFAULT_MODEL_NAME
    for name in scheme:
        build(src, out or src.parent, name.upper(), method, group_size)


@quant_app.command("verify")
def quant_verify(
    standard_url: Annotated[str, typer.Option(help="A standard-tier vLLM server")],
    fast_url: Annotated[str, typer.Option(help="The fast-tier vLLM server to judge")],
    checkpoint: Annotated[Path, typer.Option(help="Where the report goes (the fast checkpoint)")],
    model: Annotated[str, typer.Option(help="Served model name")] = "SmolLM2-135M-Instruct",
) -> None:
    """Parity of the fast tier with the standard tier; writes parity-report.{json,md}."""

    from tiergate.quant.parity import Endpoint, evaluate, render, write_report

    report = evaluate(
        Endpoint(standard_url, model),
        Endpoint(fast_url, model),
        progress=lambda m: typer.echo(f"[quant verify] {m}", err=True),
    )
    write_report(report, checkpoint, f"{checkpoint.name} vs standard")
    typer.echo(render(report, f"{checkpoint.name} vs standard"))
    raise typer.Exit(0 if report["passed"] else 1)


@spec_app.command("measure")
def spec_measure(
    url: Annotated[str, typer.Option(help="A vLLM server with speculation on")],
    model: Annotated[str, typer.Option(help="Served model name")] = "SmolLM2-135M-Instruct",
) -> None:
    """Acceptance rate and mean acceptance length from vLLM's spec-decode counters."""
    import json

    from tiergate.speculative.measure import measure_acceptance

    typer.echo(json.dumps(measure_acceptance(url, model).as_dict(), indent=2))


@spec_app.command("lossless")
def spec_lossless(
    spec_url: Annotated[str, typer.Option(help="Server with speculation")],
    base_url: Annotated[str, typer.Option(help="Same weights, no speculation")],
    model: Annotated[str, typer.Option(help="Served model name")] = "SmolLM2-135M-Instruct",
) -> None:
    """Greedy outputs with and without speculation: exact-match rate, first divergence."""
    import json

    from tiergate.speculative.measure import losslessness

    typer.echo(json.dumps(losslessness(spec_url, base_url, model), indent=2))


@bench_app.command("tiers")
def bench_tiers_cmd(
    gateway: Annotated[str, typer.Option(help="Gateway URL")] = "http://127.0.0.1:8000",
    model: Annotated[str, typer.Option(help="Served model name")] = "SmolLM2-135M-Instruct",
    levels: Annotated[list[int], typer.Option(help="Concurrencies")] = [1, 4, 16],  # noqa: B006
    requests: Annotated[int, typer.Option(help="Requests per level (at least the level)")] = 8,
    max_tokens: Annotated[int, typer.Option(help="Output tokens per request")] = 128,
    out: Annotated[Path, typer.Option(help="Report folder")] = Path("reports"),
) -> None:
    """Both tiers through the gateway at several concurrencies; Markdown, JSON and PNG."""
    import json

    from tiergate.bench.tiers import bench_tiers, chart, render_tiers

    settings = _settings()
    fast = [*settings.tiers[Tier.FAST].endpoints]
    result = bench_tiers(gateway, model, fast, levels, requests, max_tokens)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tiers-bench.json").write_text(json.dumps(result, indent=2) + "\n")
    command = "tiergate bench tiers " + " ".join(f"--levels {lv}" for lv in levels)
    (out / "tiers-bench.md").write_text(render_tiers(result, command))
    chart(result, out / "tiers-bench.png")
    typer.echo(render_tiers(result, command))


@keys_app.command("create")
def keys_create(
    name: Annotated[str, typer.Option(help="The key's name (in logs and metrics)")],
    tiers: Annotated[str, typer.Option(help="Comma-separated tiers it may use")] = "standard,fast",
    rpm: Annotated[int | None, typer.Option(help="Requests per minute")] = None,
    tpm: Annotated[int | None, typer.Option(help="Tokens per minute")] = None,
    concurrent: Annotated[int | None, typer.Option(help="Concurrent requests")] = None,
) -> None:
    """Make a key: the key itself is printed once (to stdout); configure only its hash."""
    import json

    from tiergate.gateway.auth import new_key
    from tiergate.settings import ApiKey

    key, digest = new_key()
    entry = ApiKey.model_validate(
        {
            "name": name,
            "hash": digest,
            "tiers": [t.strip() for t in tiers.split(",") if t.strip()],
            "limits": {
                "requests_per_minute": rpm,
                "tokens_per_minute": tpm,
                "max_concurrent": concurrent,
            },
        }
    )
    typer.echo(key)
    typer.echo(
        "# Give the key above to its user; it is not stored anywhere. Configuration "
        "(auth.keys entry, YAML):",
        err=True,
    )
    typer.echo("- " + json.dumps(entry.model_dump(mode="json", exclude_none=True)), err=True)


# -- tiergate jobs: thin over tiergate.jobsclient (bodies in tiergate/jobsclient/commands.py)

BaseUrlOption = Annotated[
    str | None,
    typer.Option(
        "--base-url",
        envvar="TIERGATE_BASE_URL",
        help="The gateway (default http://127.0.0.1:8000)",
        show_default=False,
    ),
]
ApiKeyOption = Annotated[
    str | None,
    typer.Option("--api-key", envvar="TIERGATE_API_KEY", help="API key", show_default=False),
]
JobIdArgument = Annotated[str, typer.Argument(help="The job's id (job_...)")]
WaitTimeoutOption = Annotated[
    float | None, typer.Option("--timeout", help="Seconds to wait at most (exit 1 after)")
]


def _jobs(base_url: str | None, api_key: str | None, body: Callable[[JobsClient], int]) -> None:
    """Run ``body(client)`` and exit with its status (2 on client errors)."""
    from tiergate.jobsclient import JobsClient
    from tiergate.jobsclient.commands import guarded

    def action() -> int:
        with JobsClient(base_url, api_key) as client:
            return body(client)

    raise typer.Exit(guarded(action))


@jobs_app.command("submit")
def jobs_submit(
    file: Annotated[
        str, typer.Argument(help="The job as JSON (POST /v1/jobs body), or - for stdin")
    ],
    wait: Annotated[
        bool, typer.Option("--wait", help="Follow the job to its end (see `jobs wait`)")
    ] = False,
    timeout: WaitTimeoutOption = None,
    idempotency_key: Annotated[
        str | None, typer.Option(help="A retry with the same key and body returns the same job")
    ] = None,
    base_url: BaseUrlOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Submit a job; print it (JSON). With --wait, as `jobs wait` does."""
    from tiergate.jobsclient import commands

    _jobs(
        base_url,
        api_key,
        lambda c: commands.submit(c, file, wait, timeout, idempotency_key),
    )


@jobs_app.command("wait")
def jobs_wait(
    job_id: JobIdArgument,
    timeout: WaitTimeoutOption = None,
    base_url: BaseUrlOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Follow a job to its end, with its progress.

    Progress goes to stderr, the final job (JSON) to stdout. Exit status: 0 if it completed
    and its verifier passed, 1 otherwise (or after --timeout), 2 on client errors."""
    from tiergate.jobsclient import commands

    _jobs(base_url, api_key, lambda c: commands.follow(c, job_id, timeout))


@jobs_app.command("get")
def jobs_get(
    job_id: JobIdArgument, base_url: BaseUrlOption = None, api_key: ApiKeyOption = None
) -> None:
    """Print a job (JSON)."""
    from tiergate.jobsclient import commands

    _jobs(base_url, api_key, lambda c: commands.show(c.get(job_id)))


@jobs_app.command("list")
def jobs_list(
    limit: Annotated[int, typer.Option(min=1, max=100, help="Jobs per page")] = 20,
    after: Annotated[str | None, typer.Option(help="Start after this job id")] = None,
    base_url: BaseUrlOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Print a page of this key's jobs, newest first (JSON; next page: --after last_id)."""
    from tiergate.jobsclient import commands

    _jobs(base_url, api_key, lambda c: commands.show(c.list(after, limit)))


@jobs_app.command("events")
def jobs_events(
    job_id: JobIdArgument,
    starting_after: Annotated[
        int, typer.Option(min=0, help="Only events after this sequence number")
    ] = 0,
    base_url: BaseUrlOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Print a job's events as JSON lines until its end.

    A dropped connection is resumed after the last event printed."""
    from tiergate.jobsclient import commands

    _jobs(base_url, api_key, lambda c: commands.events(c, job_id, starting_after))


@jobs_app.command("cancel")
def jobs_cancel(
    job_id: JobIdArgument, base_url: BaseUrlOption = None, api_key: ApiKeyOption = None
) -> None:
    """Cancel a job (idempotent); print it (JSON)."""
    from tiergate.jobsclient import commands

    _jobs(base_url, api_key, lambda c: commands.show(c.cancel(job_id)))


@jobs_app.command("replay")
def jobs_replay(
    job_id: JobIdArgument,
    wait: Annotated[
        bool, typer.Option("--wait", help="Follow the replay to its end (see `jobs wait`)")
    ] = False,
    timeout: WaitTimeoutOption = None,
    base_url: BaseUrlOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Replay a finished job's recorded commands without the model; print the replay job.

    A worker runs them in a fresh sandbox from the same initial workspace and reports per
    step whether exit status and output match (``replay`` in the job). With --wait: exit
    status 0 if every step matched, 1 otherwise (or after --timeout), 2 on client errors."""
    from tiergate.jobsclient import commands

    _jobs(base_url, api_key, lambda c: commands.replay(c, job_id, wait, timeout))


@jobs_app.command("upload")
def jobs_upload(
    path: Annotated[Path, typer.Argument(help="A tar or tar.gz archive, or a directory")],
    base_url: BaseUrlOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Upload a starting workspace; print its id (for workspace.upload_id)."""
    from tiergate.jobsclient import commands

    _jobs(base_url, api_key, lambda c: commands.upload(c, path))


def _breaker(action: str, name: str | None) -> None:
    import json

    from tiergate.queue.breaker import command
    from tiergate.queue.store import StorageError

    try:
        rows = command(_store_settings(), action, name)
    except ValueError as exc:
        typer.echo(f"tiergate env breaker: {exc}", err=True)
        raise typer.Exit(2) from None
    except StorageError as exc:
        typer.echo(f"tiergate env breaker: {exc}", err=True)
        raise typer.Exit(1) from None
    for row in rows:
        typer.echo(json.dumps(row, sort_keys=True))


@env_app.command("build")
def env_build(
    file: Annotated[
        Path, typer.Argument(help="The manifest (YAML), e.g. environments/default.yaml")
    ],
    upload: Annotated[
        bool, typer.Option("--upload/--no-upload", help="Store and register it (jobs.storage)")
    ] = True,
    out: Annotated[Path | None, typer.Option(help="Keep the built tar here")] = None,
) -> None:
    """Build an environment with mmdebstrap (needs root), store it and register its name;
    progress on stderr, then one JSON line: name, digest, bytes, build_seconds."""
    import json

    from tiergate.envs.build import BuildError
    from tiergate.envs.commands import build_command
    from tiergate.queue.store import StorageError

    jobs = _store_settings() if upload else _default_jobs()
    try:
        row = build_command(jobs, file, upload=upload, out=out)
    except (BuildError, StorageError, OSError, ValueError) as exc:
        typer.echo(f"tiergate env build: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(json.dumps(row, sort_keys=True))


def _store_settings() -> JobsSettings:
    """The jobs settings the env commands act on: the configured ones; with nothing
    configured at all (no TIERGATE_CONFIG, no TIERGATE_JOBS* variables, no object store
    endpoint), the local stack's (`make up`: SeaweedFS on 127.0.0.1:9000), so that the
    README's commands work beside it. An empty endpoint is otherwise AWS S3 itself."""
    settings = _settings()
    configured = "TIERGATE_CONFIG" in os.environ or any(
        key.startswith("TIERGATE_JOBS") for key in os.environ
    )
    if configured or settings.jobs.storage.endpoint_url is not None:
        return settings.jobs
    from tiergate.local.jobs import LocalPorts, local_jobs_settings
    from tiergate.local.servers import LOCAL_CREDENTIALS

    for key, value in LOCAL_CREDENTIALS.items():
        os.environ.setdefault(key, value)
    return local_jobs_settings(settings, LocalPorts())


def _default_jobs() -> JobsSettings:
    from tiergate.settings import JobsSettings

    return JobsSettings()


@env_app.command("list")
def env_list() -> None:
    """The registered environments (one JSON object a line)."""
    import json

    from tiergate.envs.commands import list_command
    from tiergate.queue.store import StorageError

    try:
        rows = list_command(_store_settings())
    except StorageError as exc:
        typer.echo(f"tiergate env list: {exc}", err=True)
        raise typer.Exit(1) from None
    for row in rows:
        typer.echo(json.dumps(row, sort_keys=True))


@env_breaker_app.command("list")
def env_breaker_list() -> None:
    """Every environment's breaker as stored (one JSON object a line)."""
    _breaker("list", None)


@env_breaker_app.command("open")
def env_breaker_open(
    name: Annotated[str, typer.Argument(help="The environment's name")],
) -> None:
    """Open the breaker and hold it: its jobs fail fast, no probe runs until it is closed."""
    _breaker("open", name)


@env_breaker_app.command("close")
def env_breaker_close(
    name: Annotated[str, typer.Argument(help="The environment's name")],
) -> None:
    """Close the breaker (and forget its failures): the environment's jobs run again."""
    _breaker("close", name)


def main() -> None:
    sys.exit(app())
