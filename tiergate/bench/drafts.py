"""``tiergate bench drafts``: what each speculative drafter is worth on this machine, one
sequence at a time (where drafting pays on a CPU), against no drafter in the same run.

Each drafter runs in an engine of its own (vLLM's offline engine, in a child process) on
the same model and answers, greedy, the tuner's natural prompts and its agent-job-like
ones (tiergate.speculative.measure) twice: ``first`` is each prompt's first answer,
``again`` its second, which a drafter that remembers earlier answers (suffix decoding's
global tree) drafts from. Greedy answers must be the same token for token with every
drafter: a drafter that changes an answer is reported, not ranked.

Drafters: vLLM's ngram (the fast tier's candidates' settings), suffix decoding over the
request's own prompt and output only, and suffix decoding with its global tree of earlier
answers (both need ``make suffix-decoding``; without it their rows say so).
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from tiergate.bench.gateway import cpu_model
from tiergate.bench.report import table_head, write_report
from tiergate.engine.kernels import missing_drafter
from tiergate.speculative.config import NgramConfig, SuffixConfig, to_vllm_json
from tiergate.speculative.measure import WORKLOADS

DRAFTERS: dict[str, BaseModel | None] = {
    "none": None,
    "ngram": NgramConfig(num_speculative_tokens=3, prompt_lookup_max=4),
    "suffix, prompt only": SuffixConfig(suffix_decoding_max_cached_requests=0),
    "suffix, global tree": SuffixConfig(),
}


def _child(model: str, spec_json: str, max_tokens: int) -> None:
    """One engine: prints one JSON line of figures."""
    from vllm import LLM, SamplingParams

    spec = json.loads(spec_json)
    llm = LLM(model=model, speculative_config=spec, max_model_len=2048, gpu_memory_utilization=0.5)
    tokenizer = llm.get_tokenizer()

    def chat(prompt: str) -> str:
        messages: list[Any] = [{"role": "user", "content": prompt}]
        return str(
            tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        )

    greedy = SamplingParams(temperature=0, max_tokens=max_tokens)
    llm.generate([chat("Say hello.")], greedy, use_tqdm=False)  # warm-up, thrown away
    figures: dict[str, Any] = {}
    for workload, prompts in WORKLOADS.items():
        digest = hashlib.sha256()
        for answer in ("first", "again"):
            rates = []
            for prompt in prompts:
                started = time.perf_counter()
                out = llm.generate([chat(prompt)], greedy, use_tqdm=False)[0].outputs[0]
                rates.append(len(out.token_ids) / (time.perf_counter() - started))
                digest.update(str(list(out.token_ids)).encode())
            figures[f"{workload} {answer}"] = statistics.median(rates)
        figures[f"{workload} answers"] = digest.hexdigest()[:16]
    print("FIGURES " + json.dumps(figures), flush=True)


def _run(model: str, name: str, spec: BaseModel | None, max_tokens: int, logs: Path) -> Any:
    log = logs / f"drafts-{name.replace(' ', '').replace(',', '-')}.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2"}  # GiB: the 135M model needs little
    rendered = "null" if spec is None else to_vllm_json(spec)
    cmd = [sys.executable, "-m", "tiergate.bench.drafts", model, rendered, str(max_tokens)]
    with log.open("w") as sink:
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=sink, text=True, env=env)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("FIGURES ")]
    if done.returncode != 0 or not lines:
        return f"failed (exit {done.returncode}; {log})"
    return json.loads(lines[-1].removeprefix("FIGURES "))


def run_drafts_benchmark(out: Path, model: str, max_tokens: int, logs: Path) -> dict[str, Any]:
    logs.mkdir(parents=True, exist_ok=True)
    rows: dict[str, Any] = {}
    for index, (name, spec) in enumerate(DRAFTERS.items(), 1):
        why = missing_drafter(spec)
        if why is not None:
            print(f"[bench drafts] {index}/{len(DRAFTERS)} {name}: {why}", flush=True)
            rows[name] = why
            continue
        print(f"[bench drafts] {index}/{len(DRAFTERS)} {name}: starting its engine", flush=True)
        started = time.monotonic()
        rows[name] = _run(model, name, spec, max_tokens, logs)
        print(f"[bench drafts]   done in {time.monotonic() - started:.0f} s", flush=True)
    report = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "model": model,
        "max_tokens": max_tokens,
        "drafters": {name: spec and spec.model_dump() for name, spec in DRAFTERS.items()},
        "rows": rows,
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    write_report(out, "drafts-bench", report, render(report))
    return report


def render(report: dict[str, Any]) -> str:
    rows = report["rows"]
    base = rows.get("none") if isinstance(rows.get("none"), dict) else None
    columns = [f"{w} {a}" for w in WORKLOADS for a in ("first", "again")]
    lines = [
        "# Speculative drafters, one sequence at a time",
        "",
        f"Measured {report['measured']} on {report['cpu']} ({report['cores']} cores), "
        f"model `{Path(report['model']).name}`, greedy, up to {report['max_tokens']} tokens. "
        "Output tokens per second (median over the prompts), and the speed over no drafter "
        "in the same run. `first`: each prompt's first answer; `again`: its second.",
        *table_head("drafter", *columns, "answers as without a drafter"),
    ]
    for name, row in rows.items():
        if not isinstance(row, dict):
            lines.append(f"| {name} | {row} |" + " |" * len(columns))
            continue
        cells = []
        for column in columns:
            ratio = f" ({row[column] / base[column]:.2f}x)" if base else ""
            cells.append(f"{row[column]:.1f}{ratio}")
        same = base is not None and all(
            row[f"{w} answers"] == base[f"{w} answers"] for w in WORKLOADS
        )
        lines.append(f"| {name} | {' | '.join(cells)} | {'yes' if same else 'NO'} |")
    lines.append("")
    lines.append("Command: `tiergate bench drafts`; the drafters' settings are in the JSON report.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2], int(sys.argv[3]))
