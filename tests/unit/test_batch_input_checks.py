"""What a batch's create checks in its input file (tiergate.gateway.jobs.openaibatch.api) and how
the worker cuts the same file into lines (tiergate.jobs.lines.runner): attacker's tests for
the issue-50 findings that need no servers. Each failed on the code before its fix."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tiergate.gateway.errors import OpenAIError
from tiergate.gateway.jobs.files import check_lines
from tiergate.gateway.jobs.openaibatch.inputfile import LineRules, check_input
from tiergate.jobs.lines.runner import _lines_of
from tiergate.jobs.lines.store import LineBatchStore
from tiergate.protocol.openaibatch import OpenAIBatchCreate

RULES = LineRules("/v1/chat/completions", 64, 4.0, max_output=32_768)


def _line(i: int, **body: Any) -> dict[str, Any]:
    return {
        "custom_id": f"request-{i}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body},
    }


def _file(tmp_path: Path, rows: list[Any]) -> Path:
    path = tmp_path / "input.jsonl"
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in rows))
    return path


def test_an_output_bound_that_is_not_a_positive_integer_fails_its_line(tmp_path: Path) -> None:
    """-999 was accepted and its marker (``<id>-1--999``) made every later create of the
    owner answer 500 until the batch ended; 8000.0 and no bound counted 0 tokens."""
    for bad in (-999, 0, 2.5, "8000", True):
        found = check_input(_file(tmp_path, [_line(0, max_tokens=bad)]), RULES)
        assert [(e["code"], e["param"]) for e in found.errors] == [
            ("invalid_value", "body.max_tokens")
        ], bad
    whole = check_input(_file(tmp_path, [_line(0, max_tokens=8000.0)]), RULES)
    bare = check_input(_file(tmp_path, [_line(0)]), RULES)
    assert not whole.errors and not bare.errors
    assert 8000 < whole.tokens < 8100
    assert 32_768 < bare.tokens < 32_868  # the gateway's maximum output: what it would allow
    over = check_input(_file(tmp_path, [_line(0, max_tokens=10**6)]), RULES)
    assert not over.errors and over.tokens < 32_868  # the gateway refuses it as its answer


def test_quoted_values_are_cut(tmp_path: Path) -> None:
    """100 errors quoting 1 MB custom_ids and models made a 117 MB batch object."""
    long_id = "x" * 1_000_000
    rows = [
        {**_line(0), "custom_id": long_id},
        {**_line(1), "custom_id": long_id},
        _line(2, model="y" * 1_000_000),
    ]
    found = check_input(_file(tmp_path, rows), RULES)
    assert [e["code"] for e in found.errors] == ["duplicate_custom_id", "mismatched_model"]
    assert all(len(e["message"]) < 400 for e in found.errors), found.errors


def test_a_line_no_minute_of_the_keys_limits_could_admit_is_refused_at_create(
    tmp_path: Path,
) -> None:
    rules = LineRules("/v1/chat/completions", 64, 4.0, 32_768, tokens_per_minute=100)
    big = _line(1, max_tokens=8)
    big["body"]["messages"][0]["content"] = "word " * 200  # about 250 tokens
    found = check_input(_file(tmp_path, [_line(0, max_tokens=8), big]), rules)
    assert [(e["code"], e["line"]) for e in found.errors] == [("line_over_rate_limit", 2)]


def test_a_carriage_return_inside_a_line_does_not_split_it_for_the_worker(
    tmp_path: Path,
) -> None:
    """``\\r`` is JSON whitespace: the create's check read 2 lines, the worker's
    splitlines 3 (3 internal_error answers for 2 lines, the good line never run)."""
    first = json.dumps(_line(0, max_tokens=8)).replace(', "method"', ',\r"method"')
    raw = (first + "\n" + json.dumps(_line(1, max_tokens=8)) + "\n").encode()
    path = tmp_path / "input.jsonl"
    path.write_bytes(raw)
    found = check_input(path, RULES)
    assert not found.errors and found.lines == 2
    lines = _lines_of(raw)
    assert len(lines) == 2 and all(json.loads(line)["custom_id"] for line in lines)


def test_an_input_file_id_that_is_not_a_file_id_never_reaches_the_store() -> None:
    with pytest.raises(ValidationError):
        OpenAIBatchCreate.model_validate(
            {
                "input_file_id": "../other-owner/files/file-0",
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            }
        )


class _Objects:  # fake: the one listing enqueued() reads
    def __init__(self, keys: list[str]) -> None:
        self._keys = keys

    def keys(self, prefix: str) -> list[str]:
        return [k for k in self._keys if k.startswith(prefix)]


class _Store:  # fake JobStore: its objects and prefix only
    def __init__(self, keys: list[str]) -> None:
        self.objects = _Objects(keys)

    def prefixed(self, name: str) -> str:
        return name


def test_an_older_negative_marker_does_not_break_the_owners_creates() -> None:
    root = "batchapi/owner/active/"
    store = _Store([f"{root}batch_{'a' * 32}-1--999", f"{root}batch_{'b' * 32}-3-120"])
    assert LineBatchStore(store).enqueued("owner") == (2, 4, 120)  # type: ignore[arg-type]


def _one_long_line(tmp_path: Path, size: int) -> Path:
    path = tmp_path / "long.jsonl"
    content = "x" * size
    path.write_bytes(json.dumps(_line(0, max_tokens=8) | {"pad": content}).encode() + b"\n")
    return path


def test_a_line_longer_than_a_request_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    """A file of one 190 MB line made the upload's and the batch create's checks peak at
    about 3.2x the line (+606 MiB); the chart gives a gateway 1 GiB. Lines are now read
    with a bound (gateway.max_body_bytes) and one past it is refused, naming it."""
    path = _one_long_line(tmp_path, 40 * 1024 * 1024)
    limit = 1024 * 1024
    rules = LineRules("/v1/chat/completions", 64, 4.0, 32_768, max_line_bytes=limit)
    tracemalloc.start()
    try:
        found = check_input(path, rules)
        with (
            path.open("rb") as source,
            (tmp_path / "copy").open("wb") as out,
            pytest.raises(OpenAIError) as refused,
        ):
            check_lines(source, out, 50_000, limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [(e["code"], e["line"]) for e in found.errors] == [("line_too_long", 1)]
    assert refused.value.status == 400 and refused.value.code == "line_too_long"
    assert "Line 1" in refused.value.message
    assert peak < 8 * limit, f"peak {peak / 2**20:.1f} MiB checking a 40 MiB line"


def test_a_line_of_exactly_the_limit_is_taken(tmp_path: Path) -> None:
    path = _one_long_line(tmp_path, 1000)
    size = len(path.read_bytes()) - 1  # without its newline
    rules = LineRules("/v1/chat/completions", 64, 4.0, 32_768, max_line_bytes=size)
    assert not check_input(path, rules).errors
    rules = LineRules("/v1/chat/completions", 64, 4.0, 32_768, max_line_bytes=size - 1)
    assert [e["code"] for e in check_input(path, rules).errors] == ["line_too_long"]
