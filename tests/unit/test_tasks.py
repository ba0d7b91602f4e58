"""The parity task suite: large, deterministic, and every check accepts its reference answer
and rejects wrong ones; every code task's test passes a correct function and fails wrong ones."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tiergate.quant.tasks import TASKS, Task, build_tasks, code_of

ROOT = Path(__file__).resolve().parents[2]
CODE = [t for t in TASKS if t.kind == "code"]
OTHER = [t for t in TASKS if t.kind != "code"]


def _fingerprint(suite: list[Task]) -> list[list[object]]:
    return [[t.name, t.kind, t.prompt, t.test, t.reference, t.max_tokens] for t in suite]


def test_the_suite_is_large_enough_for_a_paired_test() -> None:
    # One task flipping must move the score by less than 1%.
    assert len(TASKS) >= 150
    assert len(CODE) >= 40
    assert {t.kind for t in TASKS} >= {"code", "copy", "transform", "format", "fact"}


def test_names_are_unique() -> None:
    names = [t.name for t in TASKS]
    assert len(set(names)) == len(names)


def test_earlier_task_names_are_kept() -> None:
    by_name = {t.name: t for t in TASKS}
    assert {"add", "square", "is_even", "yes", "no", "json", "upper", "lower", "capital"} <= set(
        by_name
    )
    assert by_name["yes"].check("Yes.") and not by_name["yes"].check("Yes, sure")
    assert by_name["upper"].check("HELLO WORLD") and not by_name["upper"].check("Hello World")


def test_token_budgets() -> None:
    assert all(t.max_tokens == 112 for t in CODE)
    assert all(16 <= t.max_tokens <= 24 for t in OTHER)


def test_every_task_has_a_prompt_and_a_reference() -> None:
    for task in TASKS:
        assert task.prompt.strip() and task.reference.strip(), task.name
        assert (task.test is not None) == (task.kind == "code"), task.name


def test_generation_is_deterministic() -> None:
    assert _fingerprint(build_tasks()) == _fingerprint(TASKS)
    # A fresh import in another process with another hash seed: nothing may depend on
    # hash() or set order.
    script = (
        "import json; from tiergate.quant.tasks import TASKS; "
        "print(json.dumps([[t.name, t.kind, t.prompt, t.test, t.reference, t.max_tokens] "
        "for t in TASKS]))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == _fingerprint(TASKS)


def test_references_pass_with_lenient_formatting() -> None:
    for task in OTHER:
        ref = task.reference
        for answer in (ref, f"  {ref}.\n", f'"{ref}"', f"**{ref}**"):
            assert task.check(answer), (task.name, answer)
        if task.kind in ("copy", "sequence", "fact"):
            assert task.check(ref.upper()) and task.check(ref.lower()), task.name
        if task.kind in ("sequence", "fact", "arithmetic"):
            assert task.check(f"The answer is {ref}."), task.name


def test_checks_reject_other_answers_of_the_same_kind() -> None:
    for task in OTHER:
        assert not task.check(""), task.name
        assert not task.check("I don't know."), task.name
        for other in OTHER:
            if other.kind == task.kind and _key(other.reference) != _key(task.reference):
                assert not task.check(other.reference), (task.name, other.reference)


def _key(reference: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", reference.lower()))


def test_checks_reject_near_misses() -> None:
    for task in OTHER:
        ref = task.reference
        wrong: list[str] = []
        if task.kind == "transform":
            wrong = [ref.swapcase(), ref.capitalize()]
        elif task.kind == "copy":
            words = ref.split()
            wrong = [" ".join(words[:-1]), " ".join([words[1], words[0], *words[2:]])]
        elif task.kind == "arithmetic":
            wrong = [str(int(ref) + 1), f"{ref} or {int(ref) + 1}"]
        elif ref.startswith("{"):
            ((key, value),) = json.loads(ref).items()
            wrong = [json.dumps({key: f"{value}x"}), json.dumps({f"{key}s": value})]
        elif task.kind == "format":
            wrong = [f"{ref} and more", f"not {ref}"]
        for answer in wrong:
            assert not task.check(answer), (task.name, answer)


def test_hedged_answers_fail() -> None:
    by_name = {t.name: t for t in TASKS}
    assert not by_name["next_day"].check("Tuesday or Wednesday")
    assert by_name["next_day"].check("The day after Monday is Tuesday.")
    assert not by_name["capital"].check("Paris or London")
    assert not by_name["first_letter"].check("B or C")
    assert by_name["first_letter"].check("The first letter is a B.")
    assert not by_name["yes"].check("yes or no")
    assert by_name["sum"].check("2 + 2 = 4") and by_name["sum"].check("four")
    assert not by_name["sum"].check("4 or 5")


def _run_each(sources: list[str]) -> list[bool]:
    # One interpreter for all of them, each in a fresh namespace, to keep the test fast.
    runner = (
        "import json, sys\n"
        "results = []\n"
        "for source in json.load(sys.stdin):\n"
        "    try:\n"
        "        exec(source, {})\n"
        "        results.append(True)\n"
        "    except Exception:\n"
        "        results.append(False)\n"
        "print(json.dumps(results))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", runner],
        input=json.dumps(sources),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    results: list[bool] = json.loads(out.stdout)
    return results


def _program(task: Task, answer: str) -> str:
    # What parity.passes runs: the code extracted from the answer, then the task's test.
    assert task.test is not None
    return code_of(answer) + "\n\n" + task.test + "\n"


def _function(task: Task) -> str:
    match = re.match(r"def (\w+)\(", task.reference)
    assert match, task.name
    return match.group(1)


def test_code_references_pass_their_tests() -> None:
    answers = [f"Here it is:\n```python\n{t.reference}```\nDone." for t in CODE]
    results = _run_each([_program(t, a) for t, a in zip(CODE, answers, strict=True)])
    assert [t.name for t, ok in zip(CODE, results, strict=True) if not ok] == []
    assert all(t.check(a) for t, a in zip(CODE, answers, strict=True))


def test_code_tests_reject_wrong_functions() -> None:
    stubs = [
        "def {}(*args):\n    return None\n",
        "def {}(*args):\n    return args[0]\n",
    ]
    sources = [_program(t, stub.format(_function(t))) for t in CODE for stub in stubs]
    results = _run_each(sources)
    accepted = [s for s, ok in zip(sources, results, strict=True) if ok]
    assert accepted == []


def test_code_check_wants_the_function() -> None:
    for task in CODE:
        assert not task.check("I cannot write code."), task.name
        assert not task.check("```python\ndef other(x):\n    return x\n```"), task.name
