"""What a batch's input file holds, read once: each line checked as OpenAI's Batch API
checks it (the errors it reports, each naming its line), the chunks' byte ranges, the
enqueued-token estimate; and the plan an upload stores so that a create need not read the
file again (issue 50 item 2). Used by :mod:`tiergate.gateway.jobs.openaibatch.api`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from tiergate.gateway.openai.routes import ROUTES
from tiergate.jobs.lines.reading import LineTooLong, bounded_lines, too_long_message

_MAX_ERRORS = 100
# A caller's value quoted in an error (a custom_id, a model) is cut here: 100 errors quoting
# 1 MB ids made a 117 MB batch object.
_QUOTED_CHARS = 64


class Checked:
    """What validating an input file found: the chunks, the lines, the estimated tokens
    and the errors (each OpenAI's ``{code, message, param, line}``)."""

    def __init__(self) -> None:
        self.plan: list[list[int]] = []
        self.lines = 0
        self.tokens = 0
        self.model: str | None = None
        self.errors: list[dict[str, Any]] = []
        self.max_prompt = 0  # the longest line's prompt estimate (a key's tokens_per_minute)

    def error(self, code: str, message: str, line: int, param: str | None = None) -> None:
        if len(self.errors) < _MAX_ERRORS:
            self.errors.append({"code": code, "message": message, "param": param, "line": line})


@dataclass(frozen=True, slots=True)
class LineRules:
    """What every line of a batch is checked against: the batch's ``endpoint``, the
    gateway's ``max_output`` (gateway.max_tokens_limit: a line's output estimate when it
    sets no bound), and the owner's ``tokens_per_minute`` (a line whose prompt alone is
    over it could never be admitted, and is refused here rather than retried)."""

    endpoint: str
    chunk_lines: int
    chars_per_token: float
    max_output: int
    tokens_per_minute: int | None = None
    # gateway.max_body_bytes: a longer line could never be sent (tiergate.jobs.lines.reading).
    max_line_bytes: int = 4 * 1024 * 1024


def _quoted(value: str) -> str:
    """A caller's value as an error message quotes it: at most _QUOTED_CHARS characters."""
    if len(value) <= _QUOTED_CHARS:
        return repr(value)
    return repr(value[:_QUOTED_CHARS]) + f" (and {len(value) - _QUOTED_CHARS} more characters)"


def check_input(path: Path, rules: LineRules) -> Checked:
    """Read the input file once: its chunks' byte ranges, and every line's problems (up to
    a line longer than ``rules.max_line_bytes``, where reading stops)."""
    found = Checked()
    try:
        _check_input(found, path, rules)
    except LineTooLong as exc:
        found.error("line_too_long", too_long_message(exc), exc.number)
    return found


def _check_input(found: Checked, path: Path, rules: LineRules) -> None:
    seen: set[str] = set()
    offset = 0
    chunk_start, chunk_first, in_chunk = 0, 1, 0
    with path.open("rb") as source:
        for number, raw in enumerate(bounded_lines(source, rules.max_line_bytes), start=1):
            start, offset = offset, offset + len(raw)
            if not raw.strip():
                continue
            if in_chunk == 0:
                chunk_start, chunk_first = start, number
            in_chunk += 1
            found.lines += 1
            _check_line(found, raw, number, rules, seen)
            if in_chunk == rules.chunk_lines:
                found.plan.append([chunk_start, offset, chunk_first, in_chunk])
                in_chunk = 0
    if in_chunk:
        found.plan.append([chunk_start, offset, chunk_first, in_chunk])
    if found.lines == 0:
        found.error("empty_file", "The input file has no requests.", 0)


def _check_line(found: Checked, raw: bytes, number: int, rules: LineRules, seen: set[str]) -> None:
    try:
        line = orjson.loads(raw)
    except orjson.JSONDecodeError:
        found.error("invalid_json_line", "This line is not parseable as valid JSON.", number)
        return
    if not isinstance(line, dict):
        found.error("invalid_json_line", "This line is not a JSON object.", number)
        return
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        found.error("missing_required_parameter", "custom_id is required.", number, "custom_id")
    elif custom_id in seen:
        found.error(
            "duplicate_custom_id",
            f"The custom_id {_quoted(custom_id)} is used by an earlier line.",
            number,
            "custom_id",
        )
    else:
        seen.add(custom_id)
    if line.get("method") != "POST":
        found.error("invalid_method", "method must be POST.", number, "method")
    if line.get("url") != rules.endpoint:
        found.error(
            "invalid_url",
            f"url must be the batch's endpoint, {rules.endpoint}.",
            number,
            "url",
        )
    body = line.get("body")
    model = body.get("model") if isinstance(body, dict) else None
    if not isinstance(model, str) or not model:
        found.error("missing_required_parameter", "body.model is required.", number, "body.model")
        return
    if found.model is None:
        found.model = model
    elif model != found.model:
        found.error(
            "mismatched_model",
            f"Every line of a batch uses one model: this one asks for {_quoted(model)}, the "
            f"first for {_quoted(found.model)}.",
            number,
            "body.model",
        )
    assert isinstance(body, dict)
    route = ROUTES[rules.endpoint]
    most = _output_bound(found, body, number, route.max_token_fields, rules.max_output)
    prompt = max(1, math.ceil(sum(len(p) for p in route.prompt(body)) / rules.chars_per_token))
    found.max_prompt = max(found.max_prompt, prompt)
    per_minute = rules.tokens_per_minute
    if per_minute and prompt > per_minute:
        found.error(
            "line_over_rate_limit",
            f"This line's prompt is about {prompt} tokens, more than this key's "
            f"tokens_per_minute ({per_minute}): no minute could admit it.",
            number,
            "body",
        )
    found.tokens += math.ceil(len(raw) / rules.chars_per_token) + most


def _output_bound(
    found: Checked, body: dict[str, Any], number: int, names: tuple[str, ...], max_output: int
) -> int:
    """The line's output tokens at most, for the enqueued-token estimate: its bound (an
    integer of at least 1; one over ``max_output`` is the gateway's to refuse, as that
    line's answer, and counts as ``max_output``), else ``max_output``, which the gateway
    would allow it (0 on a route that has no output)."""
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # JSON has one number type: 16.0 is 16, as the gateway reads it
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            found.error(
                "invalid_value",
                f"body.{name} must be an integer of at least 1.",
                number,
                f"body.{name}",
            )
            return 0
        return min(value, max_output)
    return max_output if names else 0


_PLAN_VERSION = 1


def _plan_inputs(rules: LineRules) -> dict[str, Any]:
    """What a stored plan was made under: a plan made under other settings is not used."""
    return {
        "version": _PLAN_VERSION,
        "endpoint": rules.endpoint,
        "chunk_lines": rules.chunk_lines,
        "chars_per_token": rules.chars_per_token,
        "max_output": rules.max_output,
        "max_line_bytes": rules.max_line_bytes,
    }


def upload_plan(path: Path, rules: LineRules) -> dict[str, Any] | None:
    """A batch input's check made once, at upload, for the create to use instead of reading
    the file again (issue 50 item 2): the endpoint its first line names, its chunks, lines,
    estimated tokens, model and longest prompt. None where the file would fail a create's
    check (the create reads it then, and names each line's problem with the key's limits)
    or names no batch endpoint. ``rules.endpoint`` is ignored; the key's tokens_per_minute
    is checked at the create against the stored longest prompt."""
    try:
        with path.open("rb") as source:
            lines = bounded_lines(source, rules.max_line_bytes)
            first = next((raw for raw in lines if raw.strip()), b"")
        endpoint = orjson.loads(first).get("url")
    except (LineTooLong, orjson.JSONDecodeError, AttributeError):
        return None
    if not isinstance(endpoint, str) or endpoint not in ROUTES:
        return None
    rules = LineRules(
        endpoint,
        rules.chunk_lines,
        rules.chars_per_token,
        rules.max_output,
        None,
        rules.max_line_bytes,
    )
    checked = check_input(path, rules)
    if checked.errors or checked.model is None:
        return None
    return {
        **_plan_inputs(rules),
        "lines": checked.lines,
        "tokens": checked.tokens,
        "model": checked.model,
        "max_prompt": checked.max_prompt,
        "plan": checked.plan,
    }


def from_plan(stored: dict[str, Any] | None, rules: LineRules) -> Checked | None:
    """The create's check from the plan stored at upload, when it was made under these
    rules and no line's prompt is over the key's tokens_per_minute; else None (the create
    reads the file)."""
    if stored is None:
        return None
    if any(stored.get(k) != v for k, v in _plan_inputs(rules).items()):
        return None
    per_minute = rules.tokens_per_minute
    if per_minute and int(stored["max_prompt"]) > per_minute:
        return None
    found = Checked()
    found.plan = [[int(v) for v in chunk] for chunk in stored["plan"]]
    found.lines, found.tokens = int(stored["lines"]), int(stored["tokens"])
    found.model, found.max_prompt = str(stored["model"]), int(stored["max_prompt"])
    return found
