"""A batch input's check made once at upload and used by the create (issue 50 item 2):
the plan stored with the file is exactly what reading the file at the create finds, and it
is used only where it holds (the same endpoint and settings, no prompt over the key's
tokens_per_minute); anything else falls back to reading the file."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from tiergate.gateway.jobs.openaibatch.inputfile import (
    LineRules,
    check_input,
    from_plan,
    upload_plan,
)

RULES = LineRules("/v1/chat/completions", 4, 4.0, max_output=1000, max_line_bytes=4096)


def _line(i: int, url: str = "/v1/chat/completions", **body: Any) -> dict[str, Any]:
    content = "word " * (i % 7 + 1)
    return {
        "custom_id": f"request-{i}",
        "method": "POST",
        "url": url,
        "body": {"model": "m", "messages": [{"role": "user", "content": content}], **body},
    }


def _file(tmp_path: Path, rows: list[Any], blank_every: int = 0) -> Path:
    path = tmp_path / "input.jsonl"
    parts = []
    for i, row in enumerate(rows):
        parts.append(json.dumps(row).encode() + b"\n")
        if blank_every and i % blank_every == 0:
            parts.append(b"\n")
    path.write_bytes(b"".join(parts))
    return path


def test_the_plan_made_at_upload_is_what_the_create_would_read(tmp_path: Path) -> None:
    path = _file(tmp_path, [_line(i, max_tokens=i + 1) for i in range(11)], blank_every=3)
    stored = upload_plan(path, replace(RULES, endpoint="ignored"))
    assert stored is not None
    stored = json.loads(json.dumps(stored))  # as it comes back from the store
    read = check_input(path, RULES)
    planned = from_plan(stored, RULES)
    assert planned is not None and not read.errors
    assert planned.plan == read.plan and len(read.plan) == 3  # 4 + 4 + 3 lines
    assert (planned.lines, planned.tokens, planned.model) == (read.lines, read.tokens, "m")
    assert planned.max_prompt == read.max_prompt > 0


def test_a_plan_is_used_only_where_it_holds(tmp_path: Path) -> None:
    stored = upload_plan(_file(tmp_path, [_line(i) for i in range(5)]), RULES)
    assert stored is not None
    assert from_plan(stored, RULES) is not None
    assert from_plan(None, RULES) is None
    # Another endpoint at the create: the create reads the file and names each line.
    assert from_plan(stored, replace(RULES, endpoint="/v1/completions")) is None
    # Settings changed since the upload.
    assert from_plan(stored, replace(RULES, chunk_lines=8)) is None
    assert from_plan(stored, replace(RULES, max_output=2000)) is None
    assert from_plan(stored, replace(RULES, chars_per_token=3.0)) is None
    assert from_plan({**stored, "version": 0}, RULES) is None
    # A key whose minute could not admit the longest prompt: read, and refused by line.
    longest = stored["max_prompt"]
    assert from_plan(stored, replace(RULES, tokens_per_minute=longest - 1)) is None
    assert from_plan(stored, replace(RULES, tokens_per_minute=longest)) is not None


def test_no_plan_is_stored_for_a_file_a_create_would_refuse(tmp_path: Path) -> None:
    good = [_line(i) for i in range(3)]
    for rows in (
        [*good, _line(0)],  # a duplicate custom_id
        [*good, _line(9, url="/v1/completions")],  # lines of two endpoints
        [_line(0, url="/v1/nothing"), *good],  # no batch endpoint
        [*good, _line(9, model="other")],  # two models
        [*good, _line(9, max_tokens=-5)],
        [*good, {"custom_id": "x"}],
    ):
        assert upload_plan(_file(tmp_path, rows), RULES) is None, rows
    long_line = _line(0, padding="x" * 5000)
    assert upload_plan(_file(tmp_path, [long_line]), RULES) is None
    assert upload_plan(_file(tmp_path, [[1, 2]]), RULES) is None
