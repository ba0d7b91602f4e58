"""``tiergate keys``: API keys."""

from __future__ import annotations

from typing import Annotated

import typer

keys_app = typer.Typer(no_args_is_help=True, help="API keys.")


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

    from tiergate.accesssettings import ApiKey
    from tiergate.gateway.access.auth import new_key

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
        f"# Its jobs and uploads belong to {entry.owner_id} (give a replacement key "
        f'"owner": "{entry.owner_id}" to keep them).',
        err=True,
    )
    typer.echo(
        "# Give the key above to its user; it is not stored anywhere. Configuration "
        "(auth.keys entry, YAML):",
        err=True,
    )
    typer.echo("- " + json.dumps(entry.model_dump(mode="json", exclude_none=True)), err=True)
