"""The ``tiergate`` command."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from tiergate.settings import Settings, SettingsError, default_cache_dir, load_settings
from tiergate.tiers import Tier

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
model_app = typer.Typer(no_args_is_help=True, help="Prepare the embedded default model.")
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks that print figures and reports.")
app.add_typer(model_app, name="model")
keys_app = typer.Typer(no_args_is_help=True, help="API keys.")
app.add_typer(bench_app, name="bench")
app.add_typer(keys_app, name="keys")


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
) -> None:
    """Run the gateway."""
    import uvicorn

    from tiergate.gateway.app import create_app
    from tiergate.gateway.logs import configure_logging

    settings = _settings()
    configure_logging(settings.log_level)
    uvicorn.run(
        create_app(settings),
        host=host or settings.gateway.host,
        port=port if port is not None else settings.gateway.port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=30,
    )


@app.command()
def backend(
    tier: Annotated[Tier, typer.Option(help="Which tier's profile to launch")],
    dry_run: Annotated[bool, typer.Option(help="Print the command and exit")] = False,
) -> None:
    """Launch vLLM for a tier from its profile (replaces this process)."""
    from tiergate.backends.launcher import vllm_command, vllm_environment

    profile = _settings().profiles[tier]
    cmd = vllm_command(profile)
    if dry_run:
        typer.echo(" ".join(cmd))
        return
    os.execve(cmd[0], cmd, vllm_environment(profile))


@app.command()
def worker() -> None:
    """Run agent jobs from Kafka until SIGTERM (then drain)."""
    from tiergate.gateway.logs import configure_logging
    from tiergate.queue.worker import Worker

    settings = _settings()
    configure_logging(settings.log_level)
    if not settings.jobs.enabled:
        typer.echo("tiergate: jobs.enabled is false; set TIERGATE_JOBS__ENABLED=true", err=True)
        raise typer.Exit(2)
    Worker(settings.jobs).run_forever()


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
    enforce_eager: Annotated[
        bool, typer.Option(help="Skip torch.compile: starts in ~30 s instead of ~90 s")
    ] = False,
) -> None:
    """Run the whole local stack: prepare the model, start both tiers and the gateway."""
    from tiergate.stack import run_local_stack

    settings = _settings()
    code = run_local_stack(settings, enforce_eager=enforce_eager)
    raise typer.Exit(code)


@bench_app.command("gateway")
def bench_gateway(
    out: Annotated[Path, typer.Option(help="Report folder")] = Path("reports"),
    duration: Annotated[float, typer.Option(help="Seconds per measurement")] = 10.0,
) -> None:
    """Gateway overhead and throughput against a zero-cost fake backend."""
    from tiergate.bench.gateway import run_gateway_benchmark

    run_gateway_benchmark(out, duration)


@bench_app.command("limits")
def bench_limits(
    out: Annotated[Path, typer.Option(help="Report folder")] = Path("reports"),
    requests: Annotated[int, typer.Option(help="Requests per configuration")] = 5000,
) -> None:
    """Per-request cost of auth and limits, in-process and with Redis."""
    from tiergate.bench.limits import run_limits_benchmark

    run_limits_benchmark(out, requests)


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


def main() -> None:
    sys.exit(app())
