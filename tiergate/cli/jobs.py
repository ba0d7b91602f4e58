"""``tiergate jobs``: thin over tiergate.jobsclient (the bodies are in
tiergate/jobsclient/commands.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from collections.abc import Callable

    from tiergate.jobsclient import JobsClient

jobs_app = typer.Typer(
    no_args_is_help=True,
    help="Agent jobs on a gateway: submit, follow, list, cancel (tiergate.jobsclient).",
)

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


batch_app = typer.Typer(
    no_args_is_help=True,
    help="Rollout batches: many tasks across domains, several samples each.",
)
jobs_app.add_typer(batch_app, name="batch")
BatchIdArgument = Annotated[str, typer.Argument(help="The batch's id (batch_...)")]


@batch_app.command("submit")
def batch_submit(
    file: Annotated[
        str, typer.Argument(help="Tasks as JSON lines (job specs with domain, task_id)")
    ],
    samples: Annotated[int, typer.Option("--samples", help="Samples per task")] = 4,
    rounds: Annotated[int, typer.Option(help="Rounds (later ones skip saturated tasks)")] = 1,
    schedule: Annotated[
        str,
        typer.Option(
            help="per_task: each task's next round starts when its own ends; rounds: "
            "every task's once the whole batch's has ended"
        ),
    ] = "per_task",
    max_in_flight: Annotated[int, typer.Option(help="Jobs of the batch at once")] = 8,
    max_jobs: Annotated[int | None, typer.Option(help="Budget: jobs sent at most")] = None,
    weight: Annotated[
        list[str] | None, typer.Option(help="A domain's weight, domain=w (repeatable)")
    ] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Follow it, per domain, to its end")] = False,
    timeout: WaitTimeoutOption = None,
    base_url: BaseUrlOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Submit a batch; print it (JSON). With --wait, progress per domain on stderr."""
    from tiergate.jobsclient import batchcommands

    weights = {k: float(v) for k, _, v in (w.partition("=") for w in weight or [])}
    options: dict[str, object] = {
        "rounds": rounds,
        "schedule": schedule,
        "max_in_flight": max_in_flight,
    }
    if weights:
        options["domain_weights"] = weights
    if max_jobs is not None:
        options["budget"] = {"max_jobs": max_jobs}
    _jobs(
        base_url,
        api_key,
        lambda c: batchcommands.submit(c, file, samples, options, wait, timeout),
    )


@batch_app.command("get")
def batch_get(
    batch_id: BatchIdArgument, base_url: BaseUrlOption = None, api_key: ApiKeyOption = None
) -> None:
    """Print the batch (JSON): per-domain and per-task figures, skips, rollouts."""
    from tiergate.jobsclient.commands import emit

    def body(c: JobsClient) -> int:
        emit(c.get_batch(batch_id).public(with_rollouts=True))
        return 0

    _jobs(base_url, api_key, body)


@batch_app.command("rollouts")
def batch_rollouts(
    batch_id: BatchIdArgument, base_url: BaseUrlOption = None, api_key: ApiKeyOption = None
) -> None:
    """Print the finished rollouts as JSON lines (TRL's conversational shapes)."""
    from tiergate.jobsclient import batchcommands

    _jobs(base_url, api_key, lambda c: batchcommands.rollouts(c, batch_id))


@batch_app.command("cancel")
def batch_cancel(
    batch_id: BatchIdArgument, base_url: BaseUrlOption = None, api_key: ApiKeyOption = None
) -> None:
    """Cancel the batch: nothing more starts; its queued jobs are cancelled."""
    from tiergate.jobsclient.commands import emit

    def body(c: JobsClient) -> int:
        emit(c.cancel_batch(batch_id).public())
        return 0

    _jobs(base_url, api_key, body)
