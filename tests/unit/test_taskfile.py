"""A batch's tasks file, checked line by line before it is stored."""

from __future__ import annotations

import io
import json

import pytest

from tiergate.gateway.errors import OpenAIError
from tiergate.gateway.taskfile import check_tasks, read_tasks

TASK = {"domain": "d", "task_id": "t", "model": "m", "instruction": "do it"}


def _file(*lines: str) -> io.BytesIO:
    return io.BytesIO("\n".join(lines).encode())


def test_blank_and_comment_lines_are_skipped_and_the_tasks_read_in_order() -> None:
    file = _file("# a comment", json.dumps(TASK), "", json.dumps({**TASK, "task_id": "u"}))
    assert check_tasks(file) == 2
    assert [t.task_id for t in read_tasks(file)] == ["t", "u"]


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
