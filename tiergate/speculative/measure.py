"""Measuring speculative decoding on a running vLLM server.

- :func:`measure_acceptance`: runs prompts and reads the deltas of vLLM's
  ``vllm:spec_decode_*`` counters: acceptance rate = accepted / draft tokens, mean
  acceptance length = 1 + accepted / drafts.
- :func:`losslessness`: greedy outputs of a speculative engine against the same weights
  served without speculation: exact-match rate, the first divergence per prompt, and how
  near a tie the speculative engine's token was there (the same weights, teacher-forced
  on the common prefix, ranking it against their own best).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
}

PROMPTS = [
    "Write a python function that adds two numbers.",
    "Write a python function that reverses a string, with a docstring.",
    "List the days of the week, one per line.",
    "Explain in three sentences what a list is in Python.",
    "Write a short poem about the sea.",
    "Give three tips for writing clean code.",
    "Write a python class Counter with increment and reset methods.",
    "Describe how to make a cup of tea, step by step.",
]


_MODULE = """import csv
from pathlib import Path


def parse_line(line: str) -> dict[str, str]:
    name, email, team = (part.strip() for part in line.split(","))
    return {"name": name, "email": email.lower(), "team": team}


def load(path: Path) -> list[dict[str, str]]:
    rows = []
    for line in path.read_text().splitlines()[1:]:
        if line.strip():
            rows.append(parse_line(line))
    return rows
"""

# Agent-job-like answers: what an agent mostly writes back is its context, changed a little
# (a file edited and printed again, a command repeated with another flag, a config with one
# value changed). That is where prompt-lookup drafting earns most.
REPETITIVE_PROMPTS = [
    f"Here is a Python module:\n```python\n{_MODULE}```\nRename the function parse_line "
    "to parse_record everywhere and print the whole module again, in one code block.",
    f"Here is a Python module:\n```python\n{_MODULE}```\nAdd type hints where they are "
    "missing and print the whole module again, in one code block.",
    "Here is a shell session:\n$ ls -la /srv/app\n$ grep -rn TODO /srv/app/src\n"
    "$ python -m pytest -q tests/unit\n$ git status --short\nRepeat every command of the "
    "session, one per line, each with --verbose added at its end.",
    'Here is a JSON config:\n{"service": "ingest", "retries": 3, "timeout_seconds": 30, '
    '"queues": ["alpha", "beta", "gamma"], "log_level": "info"}\nReturn the same JSON with '
    "retries set to 5 and nothing else changed.",
]

WORKLOADS = {"natural": PROMPTS, "repetitive": REPETITIVE_PROMPTS}


def spec_counters(metrics_text: str) -> dict[str, float]:
    """Sum the speculative-decoding counters over every label set."""
    wanted = "\n".join(
        line
        for line in metrics_text.splitlines()
        if line.startswith(tuple(COUNTERS)) or line.startswith("# ")
    )
    found = dict.fromkeys(COUNTERS.values(), 0.0)
    for family in text_string_to_metric_families(wanted + "\n"):
        for sample in family.samples:
            # Matched on the sample's name: with ':' in names the parser does not always
            # attach the samples to the declared counter family.
            name = COUNTERS.get(sample.name.removesuffix("_total"))
            if name is not None and sample.name.endswith("_total"):
                found[name] += sample.value
    return found


@dataclass(frozen=True)
class Acceptance:
    drafts: float
    draft_tokens: float
    accepted_tokens: float

    @property
    def rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def mean_length(self) -> float:
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts else 1.0

    def as_dict(self) -> dict[str, float]:
        return {
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "acceptance_rate": self.rate,
            "mean_acceptance_length": self.mean_length,
        }


def acceptance_between(before: dict[str, float], after: dict[str, float]) -> Acceptance:
    return Acceptance(
        *(after[k] - before[k] for k in ("drafts", "draft_tokens", "accepted_tokens"))
    )


def _metrics(client: httpx.Client) -> dict[str, float]:
    return spec_counters(client.get("/metrics").text)


def measure_acceptance(
    url: str, model: str, prompts: list[str] | None = None, max_tokens: int = 128
) -> Acceptance:
    with httpx.Client(base_url=url.rstrip("/"), timeout=300) as client:
        before = _metrics(client)
        for prompt in prompts or PROMPTS:
            _greedy(client, model, prompt, max_tokens)
        return acceptance_between(before, _metrics(client))


# Speculative decoding verifies every drafted token, so under greedy decoding it emits the
# model's own argmax; the outputs still part where two tokens' logits are a near tie and
# the verification batch's other shape rounds them the other way in bf16 (how soon depends
# on the processor's kernels: after 21-60 tokens on an AMD EPYC with AVX-512 BF16, later or
# never on others). A token the model ranks this far below its best is no tie: a
# speculative engine emitting one has accepted a draft it did not verify.
NEAR_TIE_NATS = 1.0
# vLLM's default --max-logprobs.
_TOP_LOGPROBS = 20


def _greedy(
    client: httpx.Client, model: str, prompt: str, max_tokens: int
) -> tuple[list[int], list[int]]:
    """The chat prompt's token ids and the greedy answer's."""
    resp = client.post(
        "/v1/chat/completions",
        json={
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "return_token_ids": True,
        },
    )
    resp.raise_for_status()
    answer = resp.json()
    return list(answer["prompt_token_ids"]), list(answer["choices"][0]["token_ids"])


def tie_gap(client: httpx.Client, model: str, context: list[int], token: int) -> float | None:
    """How many nats the model at ``client`` ranks ``token`` below its best next token after
    ``context`` (token ids, teacher-forced); None when it is not among the top 20."""
    resp = client.post(
        "/v1/completions",
        json={
            "model": model,
            "prompt": context,
            "max_tokens": 1,
            "temperature": 0,
            "logprobs": _TOP_LOGPROBS,
            "return_tokens_as_token_ids": True,
        },
    )
    resp.raise_for_status()
    top: dict[str, float] = resp.json()["choices"][0]["logprobs"]["top_logprobs"][0]
    chosen = top.get(f"token_id:{token}")
    return None if chosen is None else max(top.values()) - chosen


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def losslessness(
    spec_url: str, base_url: str, model: str, prompts: list[str] | None = None, max_tokens: int = 96
) -> dict[str, Any]:
    """Greedy outputs with and without speculation, token by token; where they part, the
    speculative engine's token is scored by the engine without speculation on the common
    prefix (``tie_gap_nats``; ``near_tie``: within :data:`NEAR_TIE_NATS` of its best, None
    when one answer is the other's beginning)."""
    rows = []
    with (
        httpx.Client(base_url=spec_url.rstrip("/"), timeout=300) as spec,
        httpx.Client(base_url=base_url.rstrip("/"), timeout=300) as base,
    ):
        for prompt in prompts or PROMPTS:
            prompt_ids, with_spec = _greedy(spec, model, prompt, max_tokens)
            _, without = _greedy(base, model, prompt, max_tokens)
            divergence = first_divergence(with_spec, without)
            gap: float | None = None
            near: bool | None = None
            if divergence is not None and divergence < min(len(with_spec), len(without)):
                context = prompt_ids + with_spec[:divergence]
                gap = tie_gap(base, model, context, with_spec[divergence])
                near = gap is not None and gap <= NEAR_TIE_NATS
            rows.append(
                {
                    "prompt": prompt,
                    "exact": divergence is None,
                    "first_divergence": divergence,
                    "tie_gap_nats": None if gap is None else round(gap, 4),
                    "near_tie": near,
                    "tokens": [len(with_spec), len(without)],
                }
            )
    exact = sum(1 for r in rows if r["exact"])
    return {"exact_match_rate": exact / len(rows), "prompts": len(rows), "rows": rows}
