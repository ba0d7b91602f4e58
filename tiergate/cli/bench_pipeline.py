"""``tiergate bench`` for the job pipeline: agent jobs, fleet shares, OpenAI batches,
rollouts and the soak (registered on ``bench_app`` in :mod:`tiergate.cli.bench`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import typer

from tiergate.cli.common import settings_or_exit
from tiergate.tiers import Tier


def bench_jobs(
    out: Annotated[Path, typer.Option(help="Report folder")] = Path("reports"),
    jobs: Annotated[int, typer.Option(min=1, help="Jobs to submit")] = 100,
    max_workers: Annotated[int, typer.Option(min=1, help="Most workers at once")] = 4,
    churn_seconds: Annotated[
        float, typer.Option(min=1.0, help="Seconds between adding or removing a worker")
    ] = 10.0,
    broker_restart: Annotated[
        bool, typer.Option("--broker-restart/--no-broker-restart", help="Restart it midway")
    ] = True,
    deadline_seconds: Annotated[
        float, typer.Option(help="How long to wait for every job's terminal record")
    ] = 600.0,
    job_seconds: Annotated[
        float,
        typer.Option(
            min=0.0, help="How long each job's command runs (sleep; --batch: the slow domain's 10x)"
        ),
    ] = 1.0,
    short: Annotated[
        bool,
        typer.Option(
            "--short",
            help="CI-sized: 20 jobs, 2 workers at most, churn 10 s (--batch: 3 domains of 2 "
            "tasks, 2 samples each)",
        ),
    ] = False,
    assignment: Annotated[
        str, typer.Option(help="The workers' jobs.kafka.assignment (cooperative-sticky, range)")
    ] = "cooperative-sticky",
    batch: Annotated[
        bool,
        typer.Option(
            "--batch", help="One rollout batch instead of single jobs: writes jobs-batch-bench.*"
        ),
    ] = False,
    domains: Annotated[
        int, typer.Option(min=2, help="--batch: domains (the last one's tasks are 10x slower)")
    ] = 3,
    tasks_per_domain: Annotated[int, typer.Option(min=1, help="--batch: tasks per domain")] = 8,
    samples: Annotated[int, typer.Option(min=1, max=64, help="--batch: samples of each task")] = 4,
) -> None:
    """Jobs through the gateway, Kafka and a churning worker fleet (and a broker restart):
    throughput, queue waits, pickup gaps, lost/failed/run-twice; writes jobs-bench.md/.json.
    With --batch, one rollout batch across domains instead: rollouts per minute per slot,
    time to the last rollout, each domain's share of the slots; writes
    jobs-batch-bench.md/.json. Exits 1 if any job was lost, failed or run twice."""
    from tiergate.bench.jobs.fleet import FleetParams

    fleet = dataclasses.asdict(
        FleetParams(
            max_workers=max_workers,
            churn_seconds=churn_seconds,
            deadline_seconds=deadline_seconds,
        )
    )
    # Kept by --short too.
    same: dict[str, Any] = {"broker_restart": broker_restart, "assignment": assignment}
    if batch:
        from tiergate.bench.jobs.batch import SHORT_BATCH, BatchBenchParams, run_batch_benchmark

        plan = SHORT_BATCH
        if not short:
            plan = BatchBenchParams(
                **fleet,
                domains=domains,
                tasks_per_domain=tasks_per_domain,
                samples=samples,
                task_seconds=job_seconds,
            )
        _, clean = run_batch_benchmark(out, dataclasses.replace(plan, **same))
        if not clean:
            raise typer.Exit(1)
        return

    from tiergate.bench.jobs.bench import SHORT, JobsBenchParams, run_jobs_benchmark

    params = SHORT if short else JobsBenchParams(**fleet, jobs=jobs, job_seconds=job_seconds)
    params = dataclasses.replace(params, **same)
    _, clean = run_jobs_benchmark(out, params)
    if not clean:
        raise typer.Exit(1)


def bench_share(
    out: Annotated[Path, typer.Option(help="Report folder")] = Path("reports"),
    jobs_per_key: Annotated[
        int, typer.Option(min=1, help="Jobs each of the two keys submits")
    ] = 50,
    job_seconds: Annotated[float, typer.Option(min=1.0, help="How long each job runs")] = 20.0,
    workers: Annotated[int, typer.Option(min=1, help="Workers (2 slots each)")] = 2,
    share: Annotated[float, typer.Option(min=0.05, max=1.0, help="jobs.fleet_share")] = 0.5,
    window_seconds: Annotated[
        float, typer.Option(min=10.0, help="Seconds sampled after the second key submits")
    ] = 90.0,
) -> None:
    """Two keys' backlogs of long jobs on one fleet: what each runs while the other waits;
    writes jobs-share-bench.md/.json. Exits 1 if a key held more than its share while the
    other's jobs waited, or a job ran twice."""
    from tiergate.bench.jobs.share import ShareBenchParams, run_share_benchmark

    params = ShareBenchParams(jobs_per_key, job_seconds, workers, share, window_seconds)
    _, held = run_share_benchmark(out, params)
    if not held:
        raise typer.Exit(1)


def bench_batch_cmd(
    gateway: Annotated[str, typer.Option(help="Gateway URL")] = "http://127.0.0.1:8000",
    api_key: Annotated[
        str, typer.Option(envvar="OPENAI_API_KEY", help="A key of the gateway's (OPENAI_API_KEY)")
    ] = "unused",
    lines: Annotated[int, typer.Option(min=1, help="Chat requests in the batch")] = 2000,
    max_tokens: Annotated[int, typer.Option(min=1, help="Output tokens per line")] = 32,
    probes: Annotated[int, typer.Option(min=1, help="Interactive requests measured at rest")] = 8,
    baseline: Annotated[
        bool, typer.Option(help="Also run vLLM's run-batch on the standard engine's configuration")
    ] = True,
    out: Annotated[Path, typer.Option(help="Report folder")] = Path("reports"),
) -> None:
    """OpenAI's Batch API on the running stack (`tiergate up`): the batch's output tokens/s
    against vLLM's own run-batch, and interactive TTFT/TPOT while it runs against idle;
    writes batch-bench.md/.json."""
    from tiergate.bench.openaibatch import BatchBenchParams, bench_batch
    from tiergate.bench.openaibatch_report import render_batch
    from tiergate.bench.report import write_report

    settings = settings_or_exit()
    port = settings.gateway.metrics_port
    params = BatchBenchParams(
        gateway,
        api_key,
        lines,
        max_tokens,
        probes,
        baseline=baseline,
        metrics_url=f"http://127.0.0.1:{port}/metrics" if port else None,
    )
    lane = settings.jobs.batch_api.model_dump(include={"chunk_lines", "line_concurrency"}) | {
        "workers": "as the stack runs them",
        "patient": settings.admission.patient.model_dump(
            include={"adaptive", "max_concurrent", "min_concurrent", "target_slowdown"}
        ),
    }
    result = bench_batch(
        params,
        settings.profiles[Tier.STANDARD],
        settings.cache_dir / "bench-batch",
        lambda m: typer.echo(f"[bench batch] {m}", err=True),
        gpu=settings.gpu_name,
        lane=lane,
    )
    command = f"tiergate bench batch --lines {lines} --max-tokens {max_tokens} --probes {probes}"
    if not baseline:
        command += " --no-baseline"
    write_report(out, "batch-bench", result, render_batch(result, command))


def bench_rollouts_cmd(
    tasks: Annotated[int, typer.Option(min=2, help="Tasks in the batch")] = 40,
    slow_share: Annotated[
        float, typer.Option(min=0.0, max=0.5, help="Of the tasks, the slow ones")
    ] = 0.05,
    slow_factor: Annotated[
        float, typer.Option(min=1.0, help="A slow rollout against the median one")
    ] = 10.0,
    samples: Annotated[int, typer.Option(min=2, help="Samples per task and round")] = 4,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds at most")] = 3,
    workers: Annotated[int, typer.Option(min=1, help="Workers (2 slots each)")] = 2,
    short: Annotated[bool, typer.Option("--short", help="A small batch, for a quick look")] = False,
    out: Annotated[Path, typer.Option(help="Report folder")] = Path("reports"),
) -> None:
    """A heavy-tailed rollout batch on servers of its own (broker, store, workers,
    gateway, the stand-in model), once with each task going on alone and once with the
    round barrier: complete groups per minute, slot utilization, time to the first groups.
    Writes rollouts-bench.md/.json/.png."""
    from tiergate.bench.rollouts.bench import SHORT, RolloutBenchParams, run_rollouts_benchmark
    from tiergate.bench.rollouts.report import chart

    params = (
        SHORT
        if short
        else RolloutBenchParams(
            tasks=tasks,
            slow_share=slow_share,
            slow_factor=slow_factor,
            samples=samples,
            rounds=rounds,
            workers=workers,
        )
    )
    report = run_rollouts_benchmark(out, params)
    try:
        chart(report, out / "rollouts-bench.png")
    except ModuleNotFoundError:  # the chart is the bench extra's (pip install tiergate[bench])
        typer.echo("[bench rollouts] no chart: matplotlib is not installed", err=True)


def bench_soak_cmd(
    minutes: Annotated[float, typer.Option(min=1.0, help="Minutes of load")] = 60.0,
    warmup: Annotated[
        float, typer.Option(min=0.0, help="Minutes before the first fault and the growth fit")
    ] = 10.0,
    fault_rounds: Annotated[int, typer.Option(min=0, help="Every kind of fault this often")] = 2,
    seed: Annotated[int, typer.Option(help="The fault schedule's seed")] = 1,
    engine: Annotated[
        str,
        typer.Option(
            help="stand-in (the benchmarks' model server) or vllm (each tier's engine as "
            "`make up` runs it, its rates lower; run `make up` once first)"
        ),
    ] = "stand-in",
    short: Annotated[
        bool, typer.Option("--short", help="The suite's 3.5-minute form, eight kinds of fault")
    ] = False,
    out: Annotated[Path, typer.Option(help="Report folder")] = Path("reports"),
) -> None:
    """Every surface at once on the chart's topology (two gateway replicas behind a
    Service, Redis, two workers, the broker, the store, an engine per tier), with faults
    on a seeded schedule, and the history checked: nothing lost, nothing answered twice,
    nothing hung, every refusal typed. Writes soak-bench.md/.json/.png; exits 1 on a
    violation."""
    from tiergate.bench.soak.bench import SHORT, VLLM_RATES, SoakParams, run_soak
    from tiergate.bench.soak.load import Rates
    from tiergate.bench.soak.report import chart

    if engine not in ("stand-in", "vllm"):
        raise typer.BadParameter("stand-in or vllm", param_hint="--engine")
    params = (
        SHORT
        if short
        else SoakParams(
            minutes=minutes,
            warmup_minutes=warmup,
            fault_rounds=fault_rounds,
            seed=seed,
            engine=engine,
            rates=VLLM_RATES if engine == "vllm" else Rates(),
        )
    )
    report = run_soak(out, params)
    try:
        chart(report, out / "soak-bench.png")
    except ModuleNotFoundError:  # the chart is the bench extra's (pip install tiergate[bench])
        typer.echo("[bench soak] no chart: matplotlib is not installed", err=True)
    if not report["passed"]:
        raise typer.Exit(1)
