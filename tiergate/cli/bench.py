"""``tiergate bench``: benchmarks that print figures and write reports."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Annotated

import typer

from tiergate.cli import bench_pipeline
from tiergate.cli.common import settings_or_exit
from tiergate.tiers import Tier

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks that print figures and reports.")


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@bench_app.callback()
def _bench(ctx: typer.Context) -> None:
    """Benchmarks that print figures and reports."""
    # A benchmark stopped with SIGTERM (``timeout``, a CI job cancelled, ``kill``) stops
    # what it started on its way out, as Ctrl-C does: without this, the soak's engines,
    # gateways, workers and servers went on as orphans after its process was gone.
    signal.signal(signal.SIGTERM, _interrupted)


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


@bench_app.command("drafts")
def bench_drafts(
    out: Annotated[Path, typer.Option(help="Report folder")] = Path("reports"),
    model: Annotated[
        str | None,
        typer.Option(help="Checkpoint folder (default: the standard tier's model)"),
    ] = None,
    max_tokens: Annotated[int, typer.Option(help="Output tokens per answer")] = 128,
) -> None:
    """Speculative drafters (none, ngram, suffix decoding without and with its global
    tree) one sequence at a time, each in its own engine; writes drafts-bench.md/.json."""
    from tiergate.bench.drafts import run_drafts_benchmark

    settings = settings_or_exit()
    chosen = model or settings.profiles[Tier.STANDARD].model
    run_drafts_benchmark(out, chosen, max_tokens, settings.cache_dir / "logs")


@bench_app.command("tiers")
def bench_tiers_cmd(
    gateway: Annotated[str, typer.Option(help="Gateway URL")] = "http://127.0.0.1:8000",
    model: Annotated[str, typer.Option(help="Served model name")] = "SmolLM2-135M-Instruct",
    levels: Annotated[list[int], typer.Option(help="Concurrencies")] = [1, 4, 16],  # noqa: B006
    requests: Annotated[int, typer.Option(help="Requests per level (at least the level)")] = 8,
    max_tokens: Annotated[int, typer.Option(help="Output tokens per request")] = 128,
    out: Annotated[Path, typer.Option(help="Report folder")] = Path("reports"),
    workload: Annotated[
        list[str],
        typer.Option(help="natural (ordinary answers) and/or repetitive (agent-job-like edits)"),
    ] = ["natural", "repetitive"],  # noqa: B006
    plain_vllm: Annotated[
        str | None,
        typer.Option(
            help="Also measure a plain `vllm serve` of the model: its URL, or 'start' to start "
            "one with vLLM's defaults on the standard tier's cores for the run"
        ),
    ] = None,
) -> None:
    """Both tiers through the gateway at several concurrencies; Markdown, JSON and PNG."""
    import contextlib

    from tiergate.bench.plainvllm import plain_vllm as start_plain
    from tiergate.bench.report import write_report
    from tiergate.bench.tiers import bench_tiers, chart, render_tiers
    from tiergate.engine.process import healthy
    from tiergate.speculative.measure import WORKLOADS
    from tiergate.tuning.layout import serves_one, stored_layout

    settings = settings_or_exit()
    fast = [*settings.tiers[Tier.FAST].endpoints]
    layout = stored_layout(settings)
    if serves_one(layout):  # the stack's one engine serves both
        fast = [*settings.tiers[Tier.STANDARD].endpoints]
    with contextlib.ExitStack() as stack:
        plain = plain_vllm
        if plain == "start":
            port = 8199
            if healthy(f"http://127.0.0.1:{port}"):
                raise typer.BadParameter(f"port {port} already serves something")
            log = settings.cache_dir / "logs" / "vllm-plain.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            plain = stack.enter_context(
                start_plain(
                    settings.profiles[Tier.STANDARD],
                    port,
                    log,
                    lambda m: typer.echo(f"[bench tiers] {m}", err=True),
                )
            )
        unknown = sorted(set(workload) - set(WORKLOADS))
        if unknown:
            raise typer.BadParameter(f"unknown workload {unknown}: choose from {list(WORKLOADS)}")
        result = bench_tiers(
            gateway,
            model,
            fast,
            levels,
            requests,
            max_tokens,
            plain=plain,
            gpu=settings.gpu_name,
            workloads=workload,
        )
    command = "tiergate bench tiers " + " ".join(f"--levels {lv}" for lv in levels)
    command += f" --requests {requests} --max-tokens {max_tokens}"
    command += "".join(f" --workload {w}" for w in workload)
    if plain_vllm is not None:
        command += f" --plain-vllm {plain_vllm}"
    write_report(out, "tiers-bench", result, render_tiers(result, command))
    try:
        chart(result, out / "tiers-bench.png")
    except ModuleNotFoundError:  # the chart is the bench extra's (pip install tiergate[bench])
        typer.echo(
            "[bench tiers] no chart: matplotlib is not installed (tiergate[bench])", err=True
        )


@bench_app.command("urgency")
def bench_urgency_cmd(
    engines: Annotated[
        list[str] | None,
        typer.Option(
            help="Engine URL (repeatable); the first is the single one. Default: the local "
            "stack's engines that serve (one where its measured layout says one)"
        ),
    ] = None,
    model: Annotated[str, typer.Option(help="Served model name")] = "SmolLM2-135M-Instruct",
    capacity: Annotated[
        int,
        typer.Option(
            min=1,
            help="The standard tier's max_concurrent in the bench's gateway, and how many "
            "requests the throughput comparison sends at once",
        ),
    ] = 8,
    backlog: Annotated[
        int | None, typer.Option(min=2, help="Standard requests of the backlog (2x capacity)")
    ] = None,
    max_tokens: Annotated[int, typer.Option(min=1, help="Output tokens per request")] = 96,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds; the report gives medians")] = 3,
    out: Annotated[Path, typer.Option(help="Report folder")] = Path("reports"),
) -> None:
    """Urgency and shared engines through a gateway of its own in front of running engines
    (started with --scheduling-policy priority, as `tiergate up` does): throughput on both
    engines against one, and when priority and flex requests start in a standard backlog;
    writes urgency-bench.md/.json."""
    from tiergate.bench.report import write_report
    from tiergate.bench.urgency.bench import UrgencyBenchParams, bench_urgency
    from tiergate.bench.urgency.gateway import UrgencyBenchError
    from tiergate.bench.urgency.report import command_line, render_urgency

    if not engines:
        from tiergate.tuning.layout import serves_one, stored_layout

        settings = settings_or_exit()
        profiles = [settings.profiles[Tier.STANDARD], settings.profiles[Tier.FAST]]
        urls = [f"http://{p.host}:{p.port}" for p in profiles]
        layout = stored_layout(settings)
        engines = urls[:1] if serves_one(layout) else urls
    params = UrgencyBenchParams(
        engines=tuple(engines),
        model=model,
        capacity=capacity,
        backlog=backlog,
        max_tokens=max_tokens,
        rounds=rounds,
    )
    if params.backlog_requests <= capacity:
        raise typer.BadParameter("--backlog must exceed --capacity: only then do requests queue")
    try:
        result = bench_urgency(params)
    except UrgencyBenchError as exc:
        typer.echo(f"[bench urgency] {exc}", err=True)
        raise typer.Exit(1) from None
    write_report(out, "urgency-bench", result, render_urgency(result, command_line(params)))


@bench_app.command("fairness")
def bench_fairness_cmd(
    engine: Annotated[
        str | None,
        typer.Option(help="Engine URL. Default: the local stack's standard engine"),
    ] = None,
    model: Annotated[str, typer.Option(help="Served model name")] = "SmolLM2-135M-Instruct",
    flood: Annotated[
        int, typer.Option(min=2, help="Tenant A's streams at once (each tenant's max_concurrent)")
    ] = 16,
    samples: Annotated[int, typer.Option(min=1, help="Tenant B's requests per phase")] = 8,
    max_tokens: Annotated[int, typer.Option(min=2, help="Output tokens per request")] = 64,
    share_seconds: Annotated[
        float, typer.Option(min=10.0, help="Seconds both tenants flood for the token shares")
    ] = 60.0,
    out: Annotated[Path, typer.Option(help="Report folder")] = Path("reports"),
) -> None:
    """Two tenants of one priority through gateways of its own with keys, in front of a
    running engine: tenant B's time to first token and per output token while tenant A
    floods, against B alone, first come first served and then fair; each tenant's share of
    tokens when both flood. Writes fairness-bench.md/.json/.png; exits 1 if the fair
    gateway misses issue 52's targets."""
    from tiergate.bench.fairness.bench import FairnessParams, bench_fairness
    from tiergate.bench.fairness.report import (
        SHARE_TOLERANCE,
        SLOWDOWN_TARGET,
        chart,
        command_line,
        render_fairness,
    )
    from tiergate.bench.report import write_report
    from tiergate.bench.urgency.gateway import UrgencyBenchError

    if engine is None:
        profile = settings_or_exit().profiles[Tier.STANDARD]
        engine = f"http://{profile.host}:{profile.port}"
    params = FairnessParams(engine, model, flood, samples, max_tokens, share_seconds)
    try:
        result = bench_fairness(params)
    except UrgencyBenchError as exc:
        typer.echo(f"[bench fairness] {exc}", err=True)
        raise typer.Exit(1) from None
    write_report(out, "fairness-bench", result, render_fairness(result, command_line(params)))
    try:
        chart(result, out / "fairness-bench.png")
    except ModuleNotFoundError:  # the chart is the bench extra's (pip install tiergate[bench])
        typer.echo("[bench fairness] no chart: matplotlib is not installed", err=True)
    fair = result["runs"][-1]
    slowdown = [v for v in fair["b_slowdown"].values() if v is not None]
    shares = fair["shares"] or {}
    met = (
        bool(slowdown)
        and max(slowdown) <= SLOWDOWN_TARGET
        and all(
            abs(t["share"] - t["weight_share"]) <= SHARE_TOLERANCE * t["weight_share"]
            for t in shares.values()
            if isinstance(t, dict)
        )
    )
    if not met:
        raise typer.Exit(1)


# The job pipeline's benchmarks live in their own module.
bench_app.command("jobs")(bench_pipeline.bench_jobs)
bench_app.command("share")(bench_pipeline.bench_share)
bench_app.command("batch")(bench_pipeline.bench_batch_cmd)
bench_app.command("rollouts")(bench_pipeline.bench_rollouts_cmd)
bench_app.command("soak")(bench_pipeline.bench_soak_cmd)
