"""The bodies of ``tiergate jobs ...`` (tiergate/cli/jobs.py declares the commands).

Results go to stdout as JSON, progress and errors to stderr. Exit status: 0 done (for
``wait`` and ``submit --wait``: the job completed and its verifier passed), 1 the job
ended otherwise or the wait timed out, 2 the request failed (bad input, an error from the
gateway, no connection)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from tiergate.jobsclient.errors import JobsError, JobsTimeout
from tiergate.jobsclient.models import Job, JobEvent
from tiergate.jobsclient.sync import JobsClient

OK, NOT_PASSED, CLIENT_ERROR = 0, 1, 2


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def emit(data: Any) -> None:
    print(json.dumps(data, indent=2), flush=True)


def dump(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json", exclude_unset=True)


def _one_line(text: str | None, width: int = 100) -> str:
    lines = (text or "").strip().splitlines()
    first = lines[0] if lines else ""
    more = len(lines) > 1 or len(first) > width
    return first[:width] + (" ..." if more else "")


def describe(event: JobEvent) -> str:
    """One line of progress for an event."""
    kind = event.type.removeprefix("job.")
    if event.type == "job.step":
        return f"step {event.step}: {_one_line(event.command)} (exit {event.exit_code})"
    if event.type == "job.in_progress":
        return f"in_progress (attempt {event.attempt})" if event.attempt else kind
    if event.type == "job.verified":
        reward = "" if event.reward is None else f", reward {event.reward:g}"
        return f"verified: exit {event.exit_code}{reward}"
    if event.type == "job.retrying":
        why = (event.model_extra or {}).get("error")
        return f"retrying: attempt {event.attempt} in {event.delay_seconds:g} s ({why})"
    job = event.job
    if event.terminal and job is not None:
        if job.replay is not None:
            return f"{kind}: matches={str(job.replay.matches).lower()}"
        if job.error:
            return f"{kind}: {job.error.get('code')}: {_one_line(job.error.get('message'))}"
        if job.incomplete_details:
            return f"{kind}: {job.incomplete_details.get('reason')}"
        if job.result is not None:
            return f"{kind}: passed={str(job.result.passed).lower()}"
    return kind


def show(model: BaseModel) -> int:
    emit(dump(model))
    return OK


def upload(client: JobsClient, path: Path) -> int:
    print(client.upload_workspace(path), flush=True)
    return OK


def outcome(job: Job) -> int:
    return OK if job.passed else NOT_PASSED


def guarded(action: Callable[[], int]) -> int:
    """Run a command body; a client error is one line on stderr and exit status 2."""
    try:
        return action()
    except JobsTimeout as exc:
        say(f"tiergate jobs: {exc}")
        return NOT_PASSED
    except (JobsError, OSError, ValueError) as exc:
        say(f"tiergate jobs: {exc}")
        return CLIENT_ERROR
    except KeyboardInterrupt:
        say("tiergate jobs: interrupted (a submitted job goes on: `tiergate jobs wait ID`)")
        return 130


def read_job(source: str) -> dict[str, Any]:
    """A job's JSON from a file, or from stdin for ``-``."""
    text = sys.stdin.read() if source == "-" else Path(source).read_text()
    body = json.loads(text)
    if not isinstance(body, dict):
        raise ValueError("the job must be a JSON object")
    return body


def follow(
    client: JobsClient,
    job_id: str,
    timeout: float | None,
    judge: Callable[[Job], int] = outcome,
) -> int:
    """Wait for the job with its progress on stderr; print it as it ended."""

    def progress(event: JobEvent) -> None:
        say(f"[{job_id}] {describe(event)}")

    job = client.wait(job_id, timeout=timeout, on_event=progress)
    emit(dump(job))
    return judge(job)


def submit(
    client: JobsClient,
    source: str,
    wait: bool,
    timeout: float | None,
    idempotency_key: str | None,
) -> int:
    job = client.submit(read_job(source), idempotency_key=idempotency_key)
    if not wait:
        emit(dump(job))
        return OK
    say(f"[{job.id}] submitted")
    return follow(client, job.id, timeout)


def events(client: JobsClient, job_id: str, starting_after: int) -> int:
    for event in client.events(job_id, starting_after=starting_after):
        print(json.dumps(dump(event)), flush=True)
    return OK


def replayed(job: Job) -> int:
    """A replay's exit status: 0 when it completed and every step matched."""
    ok = job.status.value == "completed" and job.replay is not None and job.replay.matches
    return OK if ok else NOT_PASSED


def replay(client: JobsClient, job_id: str, wait: bool, timeout: float | None) -> int:
    job = client.replay(job_id)
    if not wait:
        emit(dump(job))
        return OK
    say(f"[{job.id}] replaying {job_id}")
    return follow(client, job.id, timeout, judge=replayed)
