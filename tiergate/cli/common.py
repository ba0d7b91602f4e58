"""What the ``tiergate`` command groups share."""

from __future__ import annotations

import typer

from tiergate.settings import Settings, SettingsError, load_settings


def settings_or_exit() -> Settings:
    """The settings; exit 2 with the reason when they do not load."""
    try:
        return load_settings()
    except SettingsError as exc:
        typer.echo(f"tiergate: {exc}", err=True)
        raise typer.Exit(2) from None
