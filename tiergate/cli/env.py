"""``tiergate env``: job environments and their circuit breakers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tiergate.cli.common import settings_or_exit

if TYPE_CHECKING:
    from tiergate.jobsettings import JobsSettings

env_app = typer.Typer(no_args_is_help=True, help="Job environments.")
env_breaker_app = typer.Typer(
    no_args_is_help=True,
    help="Environments' circuit breakers in the job store (tiergate.jobs.state.breaker).",
)
env_app.add_typer(env_breaker_app, name="breaker")


def _breaker(action: str, name: str | None) -> None:
    import json

    from tiergate.jobs.state.breaker import command
    from tiergate.jobs.state.store import StorageError

    try:
        rows = command(_store_settings(), action, name)
    except ValueError as exc:
        typer.echo(f"tiergate env breaker: {exc}", err=True)
        raise typer.Exit(2) from None
    except StorageError as exc:
        typer.echo(f"tiergate env breaker: {exc}", err=True)
        raise typer.Exit(1) from None
    if not rows and action == "list":
        # On stderr: stdout stays one JSON object a line (none) for scripts.
        typer.echo("no breaker recorded: every environment's is closed", err=True)
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
    from tiergate.jobs.state.store import StorageError

    jobs = _store_settings() if upload else _default_jobs()
    try:
        row = build_command(jobs, file, upload=upload, out=out)
    except (BuildError, StorageError, OSError, ValueError) as exc:
        typer.echo(f"tiergate env build: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(json.dumps(row, sort_keys=True))


def _store_settings() -> JobsSettings:
    """The jobs settings the env commands act on: the configured ones; with nothing
    configured at all (no TIERGATE_CONFIG, no jobs settings from the environment, no object
    store endpoint), the local stack's (`make up`: SeaweedFS on 127.0.0.1:9000), so that the
    README's commands work beside it. An empty endpoint is otherwise AWS S3 itself."""
    settings = settings_or_exit()
    configured = settings.config is not None or "jobs" in settings.model_fields_set
    if configured or settings.jobs.storage.endpoint_url is not None:
        return settings.jobs
    from tiergate.local.jobs import LocalPorts, local_jobs_settings
    from tiergate.local.servers import LOCAL_CREDENTIALS

    for key, value in LOCAL_CREDENTIALS.items():
        os.environ.setdefault(key, value)
    return local_jobs_settings(settings, LocalPorts.configured(settings))


def _default_jobs() -> JobsSettings:
    from tiergate.jobsettings import JobsSettings

    return JobsSettings()


@env_app.command("list")
def env_list() -> None:
    """The registered environments (one JSON object a line)."""
    import json

    from tiergate.envs.commands import list_command
    from tiergate.jobs.state.store import StorageError

    try:
        rows = list_command(_store_settings())
    except StorageError as exc:
        typer.echo(f"tiergate env list: {exc}", err=True)
        raise typer.Exit(1) from None
    if not rows:
        # On stderr: stdout stays one JSON object a line (none) for scripts.
        typer.echo(
            "no environment is registered (tiergate env build FILE); jobs naming "
            '"default" run in the worker\'s own system',
            err=True,
        )
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
