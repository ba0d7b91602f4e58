"""``tiergate quant verify``: the fast tier against the standard tier, through the real
serving path (two vLLM servers), on evaluation data shipped in the repository.

Three measurements, written as ``parity-report.{json,md}``:

- perplexity of each tier on held-out text (``data/heldout.txt``), and their ratio;
- top-1 agreement: on the standard tier's greedy outputs, how often the fast tier's most
  likely token is the one the standard tier chose (the standard tier's agreement with its
  own outputs is measured too: it is the noise floor of these CPU numerics);
- a task suite with checkable answers (``tasks.py``), the fast tier's score as a fraction of
  the standard tier's.

Thresholds are configuration (:class:`ParityThresholds`); the launcher refuses to start a
fast tier whose quantized checkpoint has no passing report.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, Field

from tiergate.quant.tasks import TASKS, Task, code_of

REPORT = "parity-report.json"
HELDOUT = Path(__file__).with_name("data") / "heldout.txt"


class ParityThresholds(BaseModel):
    """Pass marks. Published recoveries: INT8 W8A8 keeps about 99-100% of bf16 accuracy,
    INT4 W4A16 about 96-99%, on models of 7B and up; a 135M model loses more per bit, so the
    defaults leave room for that while still catching a broken checkpoint (whose perplexity
    ratio is far above 2 and whose agreement collapses)."""

    max_perplexity_ratio: float = Field(1.05, gt=1)
    min_top1_agreement: float = Field(0.90, gt=0, le=1)
    min_task_ratio: float = Field(0.90, gt=0)

    @classmethod
    def for_scheme(cls, scheme: str | None) -> ParityThresholds:
        if scheme == "W4A16":
            return cls(max_perplexity_ratio=1.15, min_top1_agreement=0.80, min_task_ratio=0.80)
        return cls()


class Endpoint:
    def __init__(self, url: str, model: str) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.client = httpx.Client(base_url=self.url, timeout=300)

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        resp = self.client.post(path, json={"model": self.model, **body})
        resp.raise_for_status()
        data: dict[str, Any] = resp.json()
        return data


def _prompt_scores(
    ep: Endpoint, prompt: str | list[int], top: int
) -> tuple[list[int], list[dict[str, Any]]]:
    data = ep.post(
        "/v1/completions",
        {
            "prompt": prompt,
            "max_tokens": 1,
            "temperature": 0,
            "prompt_logprobs": top,
            "return_token_ids": True,
        },
    )
    choice = data["choices"][0]
    ids = data.get("prompt_token_ids") or choice.get("prompt_token_ids")
    return list(ids), list(choice["prompt_logprobs"])


def perplexity(ep: Endpoint, texts: list[str]) -> float:
    total, count = 0.0, 0
    for text in texts:
        ids, scores = _prompt_scores(ep, text, 0)
        for token, position in zip(ids[1:], scores[1:], strict=True):
            total += position[str(token)]["logprob"]
            count += 1
    return math.exp(-total / count)


def greedy_ids(ep: Endpoint, prompt: str, max_tokens: int = 48) -> tuple[list[int], list[int]]:
    data = ep.post(
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "return_token_ids": True,
        },
    )
    return list(data["prompt_token_ids"]), list(data["choices"][0]["token_ids"])


def top1_agreement(ep: Endpoint, sequences: list[tuple[list[int], list[int]]]) -> float:
    """Share of the continuation's tokens that ``ep`` ranks first."""
    agree, count = 0, 0
    for prompt_ids, output_ids in sequences:
        ids, scores = _prompt_scores(ep, prompt_ids + output_ids, 1)
        for position in range(len(prompt_ids), len(ids)):
            count += 1
            agree += int(scores[position][str(ids[position])]["rank"] == 1)
    return agree / max(1, count)


def answer(ep: Endpoint, task: Task) -> str:
    data = ep.post(
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": task.prompt}],
            "max_tokens": 160,
            "temperature": 0,
        },
    )
    return str(data["choices"][0]["message"]["content"] or "")


def passes(task: Task, text: str) -> bool:
    if task.test is None:
        return task.check(text)
    from tiergate.queue.sandbox import Sandbox, SandboxError
    from tiergate.queue.schema import JobLimits
    from tiergate.settings import SandboxSettings

    # Model-written code runs in the job sandbox: no network, limits, unprivileged.
    try:
        box = Sandbox(
            f"parity-{uuid.uuid4().hex[:8]}",
            JobLimits(memory_mb=256),
            SandboxSettings(work_dir="/tmp/tiergate-parity"),
        )
    except SandboxError:
        raise
    try:
        box.write_files({"check.py": code_of(text) + "\n\n" + task.test + "\n"})
        return box.run("python3 check.py", timeout=10).exit_code == 0
    finally:
        box.close()


def evaluate(
    standard: Endpoint, fast: Endpoint, thresholds: ParityThresholds, progress: Any = print
) -> dict[str, Any]:
    started = time.monotonic()
    texts = [p.strip() for p in HELDOUT.read_text().split("\n\n") if p.strip()]
    progress(f"perplexity on {len(texts)} held-out passages")
    ppl_std, ppl_fast = perplexity(standard, texts), perplexity(fast, texts)
    progress(f"greedy outputs of the standard tier on {len(TASKS)} prompts")
    sequences = [greedy_ids(standard, task.prompt) for task in TASKS]
    agree_fast = top1_agreement(fast, sequences)
    agree_self = top1_agreement(standard, sequences)
    progress(f"task suite ({len(TASKS)} tasks) on both tiers")
    rows: list[dict[str, Any]] = []
    for task in TASKS:
        a_std, a_fast = answer(standard, task), answer(fast, task)
        rows.append(
            {
                "task": task.name,
                "kind": task.kind,
                "standard": passes(task, a_std),
                "fast": passes(task, a_fast),
            }
        )
    score_std = sum(1 for r in rows if r["standard"])
    score_fast = sum(1 for r in rows if r["fast"])
    task_ratio = score_fast / score_std if score_std else (1.0 if not score_fast else 0.0)
    checks = {
        "perplexity_ratio": ppl_fast / ppl_std <= thresholds.max_perplexity_ratio,
        "top1_agreement": agree_fast >= thresholds.min_top1_agreement,
        "task_ratio": task_ratio >= thresholds.min_task_ratio,
    }
    return {
        "standard": {"url": standard.url},
        "fast": {"url": fast.url},
        "perplexity": {"standard": ppl_std, "fast": ppl_fast, "ratio": ppl_fast / ppl_std},
        "top1_agreement": {"fast_vs_standard": agree_fast, "standard_vs_itself": agree_self},
        "tasks": {
            "standard_passed": score_std,
            "fast_passed": score_fast,
            "total": len(rows),
            "ratio": task_ratio,
            "rows": rows,
        },
        "thresholds": thresholds.model_dump(),
        "checks": checks,
        "passed": all(checks.values()),
        "seconds": round(time.monotonic() - started, 1),
    }


def render(report: dict[str, Any], title: str) -> str:
    p, a, t, th = (
        report["perplexity"],
        report["top1_agreement"],
        report["tasks"],
        report["thresholds"],
    )
    mark = {True: "pass", False: "FAIL"}
    lines = [
        f"# Parity: {title}",
        "",
        f"Verdict: **{'passed' if report['passed'] else 'FAILED'}**",
        "",
        "| measure | standard | fast | fast / standard | threshold | result |",
        "|---|---|---|---|---|---|",
        f"| perplexity (held-out) | {p['standard']:.3f} | {p['fast']:.3f} | {p['ratio']:.4f} "
        f"| <= {th['max_perplexity_ratio']} | {mark[report['checks']['perplexity_ratio']]} |",
        f"| top-1 agreement on standard's greedy outputs | {a['standard_vs_itself']:.4f} "
        f"(itself) | {a['fast_vs_standard']:.4f} | | >= {th['min_top1_agreement']} "
        f"| {mark[report['checks']['top1_agreement']]} |",
        f"| tasks passed | {t['standard_passed']}/{t['total']} | "
        f"{t['fast_passed']}/{t['total']} | {t['ratio']:.3f} | >= {th['min_task_ratio']} "
        f"| {mark[report['checks']['task_ratio']]} |",
        "",
        "| task | kind | standard | fast |",
        "|---|---|---|---|",
    ]
    lines += [f"| {r['task']} | {r['kind']} | {r['standard']} | {r['fast']} |" for r in t["rows"]]
    return "\n".join([*lines, ""])


def write_report(report: dict[str, Any], folder: Path, title: str) -> None:
    (folder / REPORT).write_text(json.dumps(report, indent=2) + "\n")
    (folder / "parity-report.md").write_text(render(report, title))


def has_passing_report(checkpoint: Path) -> bool:
    path = checkpoint / REPORT
    if not path.is_file():
        return False
    try:
        return bool(json.loads(path.read_text()).get("passed"))
    except json.JSONDecodeError:
        return False
