"""A batch's tasks file, checked line by line before it is stored, and written into a
batch's request a task at a time when a batch names it."""

from __future__ import annotations

import io
import json
import tracemalloc

import pytest

from tiergate.gateway.errors import OpenAIError
from tiergate.gateway.jobs.taskfile import check_tasks, write_request
from tiergate.protocol.batches import BatchCreate, BatchTask

TASK = {"domain": "d", "task_id": "t", "model": "m", "instruction": "do it"}


def _file(*lines: str) -> io.BytesIO:
    return io.BytesIO("\n".join(lines).encode())


def test_blank_and_comment_lines_are_skipped_and_the_tasks_read_in_order() -> None:
    file = _file("# a comment", json.dumps(TASK), "", json.dumps({**TASK, "task_id": "u"}))
    assert check_tasks(file) == 2
    out = io.BytesIO()
    summary = write_request(file, b"{}", out, lambda i, t: None)
    request = BatchCreate.model_validate_json(out.getvalue())
    assert [t.task_id for t in request.tasks] == ["t", "u"]
    assert (summary.count, summary.domains) == (2, {"d"})


def test_the_request_written_is_the_batch_with_its_tasks_inline() -> None:
    """What the workers read (the batch's request.json) is what an inline batch of the same
    tasks and fields is; each task is checked with its index, and a workspace upload is
    remembered at the first task naming it."""
    tasks = [
        {**TASK, "task_id": f"t{i}", "workspace": {"upload_id": "upl_" + f"{i % 2}" * 32}}
        for i in range(4)
    ]
    inline = BatchCreate.model_validate(
        {"tasks": tasks, "samples_per_task": 2, "rounds": 3, "metadata": {"run": "a"}}
    )
    header = inline.model_dump_json(exclude={"tasks", "tasks_upload_id"}).encode()
    checked: list[tuple[int, str]] = []
    out = io.BytesIO()
    summary = write_request(
        _file(*map(json.dumps, tasks)), header, out, lambda i, t: checked.append((i, t.task_id))
    )
    assert BatchCreate.model_validate_json(out.getvalue()) == inline
    assert checked == [(0, "t0"), (1, "t1"), (2, "t2"), (3, "t3")]
    assert summary.uploads == {"upl_" + "0" * 32: 0, "upl_" + "1" * 32: 1}


def test_a_refused_task_stops_the_request_at_that_task() -> None:
    def check(index: int, task: BatchTask) -> None:
        if index == 1:
            raise OpenAIError(400, f"tasks.{index}: not for you")

    with pytest.raises(OpenAIError, match=r"tasks\.1: not for you"):
        write_request(
            _file(*[json.dumps({**TASK, "task_id": n}) for n in "abc"]), b"{}", io.BytesIO(), check
        )


def test_a_task_twice_in_a_domain_is_refused_naming_its_line() -> None:
    lines = (json.dumps(TASK), json.dumps({**TASK, "domain": "e"}), json.dumps(TASK))
    with pytest.raises(OpenAIError, match="line 3: task 't' appears twice in domain 'd'"):
        write_request(_file(*lines), b"{}", io.BytesIO(), lambda i, t: None)


def test_writing_a_request_holds_one_task_at_a_time() -> None:
    """A 4 MiB file of 5,000 tasks: what is allocated at the peak while its request is
    written stays under 2 MiB (mostly the tasks' ids, for the duplicate check). Parsed whole, as
    before, the same file held 37 MiB."""
    pad = "x" * 800
    lines = [json.dumps({**TASK, "task_id": f"t{i}", "instruction": pad}) for i in range(5000)]
    file = _file(*lines)
    out = open("/dev/null", "wb")  # noqa: SIM115 (closed below)
    tracemalloc.start()
    try:
        summary = write_request(file, b"{}", out, lambda i, t: None)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        out.close()
    assert summary.count == 5000
    assert len(file.getvalue()) > 4 * 1024 * 1024
    assert peak < 2 * 1024 * 1024, peak


@pytest.mark.parametrize(
    ("lines", "said"),
    [
        ((json.dumps(TASK), "{not json"), "tasks file line 2: "),
        ((json.dumps(TASK), json.dumps({**TASK, "domain": "bad domain!"})), "line 2: domain"),
        (("# only a comment", ""), "holds no task"),
    ],
)
def test_a_bad_file_is_refused_naming_its_first_bad_line(lines: tuple[str, ...], said: str) -> None:
    with pytest.raises(OpenAIError) as refused:
        check_tasks(_file(*lines))
    assert refused.value.status == 400
    assert said in refused.value.message
