"""A batch's tasks as an uploaded JSON-lines file (``POST /v1/jobs/batches/tasks``): one
task a line (an ordinary job spec plus ``domain`` and ``task_id``), blank lines and lines
starting with ``#`` skipped, as ``tiergate jobs batch submit`` reads a file. It is checked
line by line when it is uploaded (400 naming the first bad line), stored as one of the
key's uploads (the same quota, count and time to live as workspaces), and read whole
when a batch names it (``tasks_upload_id``): the batch's request then holds its tasks, so
the workers never read the file."""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO

from pydantic import ValidationError

from tiergate.gateway.errors import OpenAIError
from tiergate.protocol.batches import MAX_BATCH_TASKS, BatchTask


def _lines(file: IO[bytes]) -> Iterator[tuple[int, BatchTask]]:
    file.seek(0)
    for number, raw in enumerate(file, 1):
        line = raw.strip()
        if not line or line.startswith(b"#"):
            continue
        try:
            yield number, BatchTask.model_validate_json(line)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            said = f"{where}: {first['msg']}" if where else first["msg"]
            raise OpenAIError(
                400, f"tasks file line {number}: {said}", code="invalid_upload"
            ) from None


def check_tasks(file: IO[bytes]) -> int:
    """How many tasks ``file`` holds; 400 at its first bad line, or when it holds none or
    more than a batch may have."""
    count = 0
    for _ in _lines(file):
        count += 1
        if count > MAX_BATCH_TASKS:
            raise OpenAIError(
                400,
                f"The tasks file holds more than {MAX_BATCH_TASKS} tasks, a batch's most.",
                code="invalid_upload",
            )
    if count == 0:
        raise OpenAIError(400, "The tasks file holds no task.", code="invalid_upload")
    return count


def read_tasks(file: IO[bytes]) -> list[BatchTask]:
    return [task for _, task in _lines(file)]
