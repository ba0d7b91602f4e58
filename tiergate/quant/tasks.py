"""Evaluation tasks with checkable answers, chosen for a small model: short code that runs,
format following, copying and simple transformations."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

CheckFn = Callable[[str], bool]


@dataclass(frozen=True)
class Task:
    name: str
    kind: str
    prompt: str
    check: CheckFn
    # Code tasks: a test appended to the model's code and run in the sandbox.
    test: str | None = None


def _code(text: str) -> str:
    match = re.search(r"```(?:python)?\n(.*?)```", text, re.S)
    return match.group(1) if match else text


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip().strip(".").strip('"').strip("'")).lower()


def _json_has(key: str, value: object) -> CheckFn:
    def check(text: str) -> bool:
        match = re.search(r"\{.*?\}", text, re.S)
        if not match:
            return False
        try:
            return bool(json.loads(match.group(0)).get(key) == value)
        except (json.JSONDecodeError, AttributeError):
            return False

    return check


TASKS: list[Task] = [
    Task(
        "add",
        "code",
        "Write a python function add(a, b) that returns the sum of two numbers.",
        lambda t: True,
        test="assert add(2, 3) == 5 and add(-1, 1) == 0",
    ),
    Task(
        "square",
        "code",
        "Write a python function square(x) that returns x squared.",
        lambda t: True,
        test="assert square(4) == 16 and square(-3) == 9",
    ),
    Task(
        "is_even",
        "code",
        "Write a python function is_even(n) that returns True if n is even, else False.",
        lambda t: True,
        test="assert is_even(4) and not is_even(7)",
    ),
    Task(
        "max_of",
        "code",
        "Write a python function largest(numbers) that returns the largest number in a list.",
        lambda t: True,
        test="assert largest([3, 9, 2]) == 9",
    ),
    Task(
        "reverse_fn",
        "code",
        "Write a python function reverse_string(s) that returns the string reversed.",
        lambda t: True,
        test="assert reverse_string('abc') == 'cba'",
    ),
    Task("yes", "format", "Answer with only the word yes.", lambda t: _norm(t) == "yes"),
    Task("no", "format", "Reply with just the word no, nothing else.", lambda t: _norm(t) == "no"),
    Task(
        "number",
        "format",
        "What is 2 plus 2? Answer with only the number.",
        lambda t: _norm(t) == "4",
    ),
    Task(
        "json",
        "format",
        'Return a JSON object with a key "name" whose value is "Bob". Only the JSON.',
        _json_has("name", "Bob"),
    ),
    Task(
        "copy_fox",
        "copy",
        "Repeat exactly: the quick brown fox",
        lambda t: "the quick brown fox" in t.lower(),
    ),
    Task(
        "copy_code",
        "copy",
        "Repeat this text exactly: hello world 123",
        lambda t: "hello world 123" in t.lower(),
    ),
    Task("upper", "transform", "Convert to uppercase: hello world", lambda t: "HELLO WORLD" in t),
    Task("lower", "transform", "Convert to lowercase: GOOD MORNING", lambda t: "good morning" in t),
    Task(
        "capital",
        "fact",
        "What is the capital of France? Answer in one word.",
        lambda t: "paris" in t.lower(),
    ),
]


def code_of(text: str) -> str:
    return _code(text)
