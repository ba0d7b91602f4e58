"""``tiergate model``, ``quant`` and ``spec``: the embedded model, its quantized
checkpoints and speculative decoding."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tiergate.cli.common import settings_or_exit

model_app = typer.Typer(no_args_is_help=True, help="Prepare the embedded default model.")
quant_app = typer.Typer(no_args_is_help=True, help="Quantized checkpoints and their parity.")
spec_app = typer.Typer(no_args_is_help=True, help="Speculative decoding measurements.")


@model_app.command("prepare")
def model_prepare(
    out: Annotated[Path | None, typer.Option(help="Checkpoint folder")] = None,
) -> None:
    """Convert the embedded SmolLM2 GGUF into a Hugging Face checkpoint (once)."""
    from tiergate.enginesettings import DEFAULT_MODEL_NAME
    from tiergate.quant.convert import prepare_embedded_model

    target = out or settings_or_exit().cache_dir / "models" / DEFAULT_MODEL_NAME
    prepare_embedded_model(target)


@quant_app.command("build")
def quant_build(
    source: Annotated[Path | None, typer.Option(help="Standard-tier checkpoint")] = None,
    scheme: Annotated[list[str], typer.Option(help="W8A8 and/or W4A16")] = ["W8A8", "W4A16"],  # noqa: B006
    method: Annotated[
        str,
        typer.Option(
            help="rtn (no calibration), gptq, or sq-gptq (W8A8: sensitive layers kept in "
            "bf16, SmoothQuant, GPTQ)"
        ),
    ] = "rtn",
    group_size: Annotated[int, typer.Option(help="W4A16 group size (must divide widths)")] = 64,
    out: Annotated[Path | None, typer.Option(help="Folder for the checkpoints")] = None,
) -> None:
    """Build INT8 (W8A8) and INT4 (W4A16) checkpoints with llm-compressor."""
    from tiergate.enginesettings import DEFAULT_MODEL_NAME
    from tiergate.quant.build import build

    settings = settings_or_exit()
    src = source or settings.cache_dir / "models" / DEFAULT_MODEL_NAME
    for name in scheme:
        build(settings.quant_python, src, out or src.parent, name.upper(), method, group_size)


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
