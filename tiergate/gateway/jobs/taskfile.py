"""A batch's tasks as an uploaded JSON-lines file (``POST /v1/jobs/batches/tasks``): one
task a line (an ordinary job spec plus ``domain`` and ``task_id``), blank lines and lines
starting with ``#`` skipped, as ``tiergate jobs batch submit`` reads a file. It is checked
line by line when it is uploaded (400 naming the first bad line), stored as one of the
key's uploads (the same quota, count and time to live as workspaces), and read again when
a batch names it (``tasks_upload_id``): a line at a time, each task checked and written
out as it is read (:func:`write_request`), into the batch's request, which then holds its
tasks, so the workers never read the file. The gateway never holds the tasks whole: a
16 MiB file of 20,000 tasks cost it +160 MiB parsed whole, and a few MiB so (issue 33)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
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


@dataclass
class TaskSummary:
    """What a batch's checks need of its tasks once each has been checked alone: how many,
    their domains, and the first task naming each workspace upload."""

    count: int = 0
    domains: set[str] = field(default_factory=set)
    uploads: dict[str, int] = field(default_factory=dict)

    def add(self, index: int, task: BatchTask) -> None:
        self.count += 1
        self.domains.add(task.domain)
        if task.workspace.upload_id:
            self.uploads.setdefault(task.workspace.upload_id, index)


def write_request(
    file: IO[bytes],
    header: bytes,
    out: IO[bytes],
    check: Callable[[int, BatchTask], None],
) -> TaskSummary:
    """The tasks of ``file`` written to ``out`` as a batch's request, JSON that
    :class:`~tiergate.protocol.batches.BatchCreate` reads: ``header`` (the request's other
    fields as a JSON object) with ``tasks`` set to them. Each task is validated, passed to
    ``check`` (with its index among the tasks) and written before the next line is read;
    400 at the first bad line, a task that appears twice in a domain, or past a batch's
    most tasks."""
    if not header.startswith(b"{") or not header.endswith(b"}"):
        raise ValueError("the header is a JSON object")
    summary = TaskSummary()
    seen: set[tuple[str, str]] = set()
    out.write(b'{"tasks":[')
    for number, task in _lines(file):
        if summary.count >= MAX_BATCH_TASKS:
            raise OpenAIError(
                400,
                f"The tasks file holds more than {MAX_BATCH_TASKS} tasks, a batch's most.",
                code="invalid_upload",
            )
        if (task.domain, task.task_id) in seen:
            raise OpenAIError(
                400,
                f"tasks file line {number}: task {task.task_id!r} appears twice in domain "
                f"{task.domain!r}",
                code="invalid_upload",
            )
        seen.add((task.domain, task.task_id))
        check(summary.count, task)
        out.write(b"," if summary.count else b"")
        out.write(task.model_dump_json().encode())
        summary.add(summary.count, task)
    if summary.count == 0:
        raise OpenAIError(400, "The tasks file holds no task.", code="invalid_upload")
    out.write(b"]" + (b"," + header[1:] if header != b"{}" else b"}"))
    return summary
