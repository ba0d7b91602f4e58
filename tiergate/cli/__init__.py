"""The ``tiergate`` command."""

from __future__ import annotations

import sys

import typer

from tiergate.cli import bench, env, jobs, keys, models, serving, usage

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
app.command()(serving.serve)
app.command()(serving.backend)
app.command()(serving.tune)
app.command()(serving.worker)
app.command()(serving.up)
app.command()(usage.usage)
app.add_typer(models.model_app, name="model")
app.add_typer(bench.bench_app, name="bench")
app.add_typer(keys.keys_app, name="keys")
app.add_typer(models.quant_app, name="quant")
app.add_typer(models.spec_app, name="spec")
app.add_typer(jobs.jobs_app, name="jobs")
app.add_typer(env.env_app, name="env")


def main() -> None:
    sys.exit(app())
