"""The bodies of ``tiergate jobs batch ...`` (tiergate/cli/jobs.py declares them): results
to stdout as JSON (rollouts as JSON lines), progress per domain to stderr. Exit status: 0
done, 1 the wait timed out or the batch was cancelled, 2 the request failed."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tiergate.jobsclient.commands import CLIENT_ERROR, NOT_PASSED, OK, emit, say
from tiergate.jobsclient.errors import JobsTimeout
from tiergate.jobsclient.models import Batch
from tiergate.jobsclient.sync import JobsClient


def read_tasks(file: str) -> tuple[list[dict[str, Any]], bytes]:
    """Tasks from a JSONL file (one task a line; blank lines and ``#`` lines skipped), and
    the file's bytes as read."""
    raw = sys.stdin.buffer.read() if file == "-" else Path(file).read_bytes()
    text = raw.decode()
    tasks = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            tasks.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{file}:{number}: not JSON ({exc.msg})") from None
    return tasks, raw


def progress(batch: Batch) -> None:
    parts = []
    for domain, entry in sorted(batch.domains.items()):
        counts = entry.get("counts", {})
        done = sum(counts.get(s, 0) for s in ("completed", "incomplete", "failed", "cancelled"))
        rate = entry.get("pass_rate")
        shown = "-" if rate is None else f"{rate:.0%}"
        parts.append(f"{domain} {done}/{sum(counts.values())} pass {shown}")
    removed = f"; removed: {', '.join(batch.removed_domains)}" if batch.removed_domains else ""
    say(f"[{batch.id}] round {batch.round}: " + "; ".join(parts) + removed)


def submit(
    client: JobsClient,
    file: str,
    samples: int,
    options: dict[str, Any],
    wait: bool,
    timeout: float | None,
) -> int:
    try:
        tasks, raw = read_tasks(file)
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        say(f"error: {exc}")
        return CLIENT_ERROR
    # Uploaded as a file (POST /v1/jobs/batches/tasks), not inline: a file of thousands of
    # tasks is over a request body's limit, and the gateway names a bad task by its line.
    upload_id = client.upload_tasks(raw)
    batch = client.submit_batch(samples_per_task=samples, tasks_upload_id=upload_id, **options)
    say(f"batch {batch.id}: {len(tasks)} tasks, {samples} samples each")
    if not wait:
        emit(batch.public())
        return OK
    try:
        batch = client.wait_batch(batch.id, timeout=timeout, on_progress=progress)
    except JobsTimeout as exc:
        say(f"timed out: {exc}")
        return NOT_PASSED
    emit(batch.public())
    return OK if batch.status == "completed" else NOT_PASSED


def rollouts(client: JobsClient, batch_id: str) -> int:
    for record in client.rollouts(batch_id):
        print(json.dumps(record), flush=True)
    return OK
