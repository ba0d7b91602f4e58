"""``tiergate usage``: the calling key's spend budgets, as the gateway counts them."""

from __future__ import annotations

import time
from typing import Annotated

import httpx
import typer

from tiergate.cli.jobs import ApiKeyOption, BaseUrlOption


def usage(
    base_url: BaseUrlOption = None,
    api_key: ApiKeyOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="The gateway's answer as is")] = False,
) -> None:
    """What the key (and its team) may still spend today and this month (GET /v1/usage)."""
    base = (base_url or "http://127.0.0.1:8000").rstrip("/")
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        answer = httpx.get(f"{base}/v1/usage", headers=headers, timeout=30)
    except httpx.HTTPError as exc:
        typer.echo(f"tiergate usage: {base}: {exc}", err=True)
        raise typer.Exit(1) from None
    if answer.status_code != 200:
        typer.echo(f"tiergate usage: {answer.status_code} {answer.text[:500]}", err=True)
        raise typer.Exit(1)
    body = answer.json()
    if as_json:
        typer.echo(answer.text)
        return
    if not body["data"]:
        typer.echo(f"{body['key']}: no spend budget is set")
        return
    typer.echo(
        f"{'scope':<6} {'name':<26} {'period':<6} {'unit':<6} {'limit':>12} {'spent':>12} "
        f"{'left':>12}  renews (UTC)"
    )
    for b in body["data"]:
        renews = time.strftime("%Y-%m-%d %H:%M", time.gmtime(b["resets_at"]))
        unit = b.get("unit", "tokens")
        limit, spent, left = (b[f"{f}_{unit}"] for f in ("limit", "spent", "remaining"))
        if unit == "usd":
            limit, spent, left = (f"{v:.6f}" for v in (limit, spent, left))
        typer.echo(
            f"{b['scope']:<6} {b['name'][:26]:<26} {b['period']:<6} {unit:<6} {limit:>12} "
            f"{spent:>12} {left:>12}  {renews}"
        )
    prices = body.get("prices_per_million_tokens")
    if prices:
        typer.echo(
            "dollars per million tokens: "
            + ", ".join(f"{tier} {price:g}" for tier, price in sorted(prices.items()))
        )
