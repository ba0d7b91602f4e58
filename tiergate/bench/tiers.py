"""``tiergate bench tiers``.

- tiers: the same prompts through the gateway to each tier at several concurrencies;
  per-request output speed (1/TPOT), aggregate output tokens/s, TTFT and TPOT p50/p99,
  fast/standard ratios and the fast tier's acceptance figures. The samples (and how TPOT
  is counted) are ``tiergate.measure.stream``'s.
Choosing the fast tier among candidate recipes is ``tiergate tune``, the tuning package.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
from pathlib import Path
from typing import Any

import httpx

from tiergate.bench.report import table_head
from tiergate.measure.fingerprint import hardware_fingerprint
from tiergate.measure.stream import Sample, run_level
from tiergate.speculative.measure import WORKLOADS, acceptance_between, spec_counters


def _say(message: str) -> None:
    print(f"[bench tiers] {message}", file=sys.stderr, flush=True)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def summarize(samples: list[Sample], wall: float) -> dict[str, float]:
    tpots = [s.tpot for s in samples if s.tpot]
    ttfts = [s.ttft for s in samples]
    return {
        "requests": len(samples),
        "output_tokens": sum(s.tokens for s in samples),
        "per_request_tokens_per_s_p50": statistics.median(1 / t for t in tpots) if tpots else 0,
        "aggregate_tokens_per_s": sum(s.tokens for s in samples) / wall,
        "ttft_p50_ms": statistics.median(ttfts) * 1000,
        "ttft_p99_ms": _pct(ttfts, 0.99) * 1000,
        "tpot_p50_ms": statistics.median(tpots) * 1000 if tpots else 0,
        "tpot_p99_ms": _pct(tpots, 0.99) * 1000,
    }


def _scrape(urls: list[str]) -> dict[str, float]:
    total: dict[str, float] = {}
    for url in urls:
        for key, value in spec_counters(httpx.get(f"{url}/metrics", timeout=10).text).items():
            total[key] = total.get(key, 0.0) + value
    return total


def _fast_recipe(gateway: str) -> str:
    """What the gateway says the fast tier runs (``/v1/tiers``)."""
    try:
        tiers = httpx.get(f"{gateway.rstrip('/')}/v1/tiers", timeout=10).json()["data"]
        return str(next(t["runs"] for t in tiers if t["tier"] == "fast"))
    except (httpx.HTTPError, KeyError, StopIteration, ValueError):
        return "unknown"


PLAIN = "plain vllm"


def _tuner_figures(gateway: str) -> list[dict[str, Any]]:
    """The tuner's candidates as the gateway publishes them (``/v1/tiers``)."""
    try:
        body = httpx.get(f"{gateway.rstrip('/')}/v1/tiers", timeout=10).json()
    except (httpx.HTTPError, ValueError):
        return []
    return tuner_figures(body)


def tuner_figures(tiers_body: dict[str, Any]) -> list[dict[str, Any]]:
    """Each candidate of the decision in a ``GET /v1/tiers`` body: its status, speedups and
    parity verdict, measured engine to engine at tuning time ([] without a decision)."""
    decision = tiers_body.get("decision") or {}
    return [
        {
            "recipe": c["recipe"]["name"],
            "status": c["status"],
            "speedup": c.get("speedup", {}),
            "parity": None if c.get("parity") is None else c["parity"].get("passed"),
        }
        for c in decision.get("candidates", [])
    ]


def bench_tiers(
    gateway: str,
    model: str,
    fast_engines: list[str],
    levels: list[int],
    requests: int,
    max_tokens: int,
    rounds: int = 2,
    plain: str | None = None,
    *,
    gpu: str,
    workloads: list[str] | None = None,
) -> dict[str, Any]:
    """Both tiers at each level, for each workload (``WORKLOADS``: natural answers and
    agent-job-like ones that repeat their context), interleaved: ``rounds`` batches per tier
    in turn (the order rotating), so that a slow minute of this shared machine does not land
    on one tier only. ``plain``: the URL of a plain ``vllm serve`` of the same model,
    measured directly in the same turns, and each tier's speed as a ratio of its. ``gpu``:
    settings' ``gpu_name``, for the report's hardware fingerprint. The tuner's own figures
    (engine to engine, at tuning time) are kept beside, from ``/v1/tiers``."""
    url = f"{gateway.rstrip('/')}/v1/chat/completions"
    targets: list[tuple[str, str, str | None]] = [
        ("standard", url, "default"),
        ("fast", url, "priority"),
    ]
    if plain is not None:
        targets.append((PLAIN, f"{plain.rstrip('/')}/v1/chat/completions", None))
    results: dict[str, Any] = {
        "hardware": hardware_fingerprint(gpu),
        "fast_recipe": _fast_recipe(gateway),
        "levels": levels,
        "max_tokens": max_tokens,
        "rounds": rounds,
        "tuner": _tuner_figures(gateway),
        "workloads": {},
    }
    for workload in workloads or list(WORKLOADS):
        results["workloads"][workload] = _workload(
            targets, model, fast_engines, levels, requests, max_tokens, rounds, workload
        )
    return results


def _workload(
    targets: list[tuple[str, str, str | None]],
    model: str,
    fast_engines: list[str],
    levels: list[int],
    requests: int,
    max_tokens: int,
    rounds: int,
    workload: str,
) -> dict[str, Any]:
    prompts = WORKLOADS[workload]
    tiers = [(name, word) for name, _, word in targets]
    urls = {name: target for name, target, _ in targets}
    results: dict[str, Any] = {"tiers": {tier: {} for tier, _ in tiers}}
    accepted = dict.fromkeys(("drafts", "draft_tokens", "accepted_tokens"), 0.0)
    for level in levels:
        per_round = max(requests, level) // rounds or 1
        collected: dict[str, tuple[list[Sample], float]] = {t: ([], 0.0) for t, _ in tiers}
        for round_ in range(rounds):
            for tier, word in tiers[round_ % len(tiers) :] + tiers[: round_ % len(tiers)]:
                _say(
                    f"{workload}: {tier}: concurrency {level}, round {round_ + 1}/{rounds}, "
                    f"{max(per_round, level)} requests"
                )
                before = _scrape(fast_engines) if tier == "fast" and fast_engines else None
                samples, wall = asyncio.run(
                    run_level(
                        urls[tier], model, word, level, max(per_round, level), max_tokens, prompts
                    )
                )
                if before is not None:
                    after = _scrape(fast_engines)
                    for key in accepted:
                        accepted[key] += after[key] - before[key]
                done, spent = collected[tier]
                collected[tier] = (done + samples, spent + wall)
        for tier, (samples, wall) in collected.items():
            results["tiers"][tier][str(level)] = summarize(samples, wall)
    if fast_engines:
        results["acceptance"] = acceptance_between(dict.fromkeys(accepted, 0.0), accepted).as_dict()
    results["ratios"] = {
        str(level): {
            key: results["tiers"]["fast"][str(level)][key]
            / max(1e-9, results["tiers"]["standard"][str(level)][key])
            for key in ("per_request_tokens_per_s_p50", "aggregate_tokens_per_s", "tpot_p50_ms")
        }
        for level in levels
    }
    if PLAIN in urls:
        # Output speed against the plain server's: its median TPOT over the tier's.
        results["vs_plain"] = {
            str(level): {
                tier: results["tiers"][PLAIN][str(level)]["tpot_p50_ms"]
                / max(1e-9, results["tiers"][tier][str(level)]["tpot_p50_ms"])
                for tier in ("standard", "fast")
            }
            for level in levels
        }
    return results


def render_tiers(r: dict[str, Any], command: str) -> str:
    rows = [
        "# Tier benchmark",
        "",
        f"Command: `{command}`",
        "",
        f"CPU: {r.get('hardware', {}).get('cpu', 'unknown')} "
        f"({r.get('hardware', {}).get('cores', '?')} cores; "
        f"ISA {r.get('hardware', {}).get('isa', '?')}). Fast tier: {r.get('fast_recipe', '?')}.",
        "",
        "Through the gateway, as a caller sees it: `service_tier` `default` (standard) and "
        "`priority` (fast), greedy, streamed, every ratio from the same run.",
    ]
    for workload, w in r["workloads"].items():
        rows += ["", f"## {workload} answers", "", *_workload_rows(w)]
    if r.get("tuner"):
        levels = sorted({lv for c in r["tuner"] for lv in c["speedup"]}, key=int)
        rows += [
            "",
            "## The tuner's figures (engine to engine, natural answers, at tuning time)",
            "",
            "| recipe | status | "
            + " | ".join(f"fast/standard TPOT at c={lv}" for lv in levels)
            + " | parity |",
            "|---|---|" + "---|" * len(levels) + "---|",
        ]
        for c in r["tuner"]:
            speeds = " | ".join(
                f"{c['speedup'][lv]:.2f}x" if lv in c["speedup"] else "-" for lv in levels
            )
            parity = {True: "passed", False: "failed", None: "not judged"}[c["parity"]]
            rows.append(f"| {c['recipe']} | {c['status']} | {speeds} | {parity} |")
    return "\n".join([*rows, ""])


def _workload_rows(w: dict[str, Any]) -> list[str]:
    rows = [
        "| tier | concurrency | per-request tokens/s (p50) | aggregate tokens/s | TTFT p50 / p99 "
        "(ms) | TPOT p50 / p99 (ms) |",
        "|---|---|---|---|---|---|",
    ]
    for tier, levels in w["tiers"].items():
        for level, s in levels.items():
            rows.append(
                f"| {tier} | {level} | {s['per_request_tokens_per_s_p50']:.1f} | "
                f"{s['aggregate_tokens_per_s']:.1f} | {s['ttft_p50_ms']:.0f} / "
                f"{s['ttft_p99_ms']:.0f} | {s['tpot_p50_ms']:.1f} / "
                f"{s['tpot_p99_ms']:.1f} |"
            )
    rows += table_head(
        "concurrency",
        "fast/standard output speed (ratio of median TPOT)",
        "fast/standard aggregate tokens/s",
    )
    for level, ratio in w["ratios"].items():
        rows.append(
            f"| {level} | {1 / ratio['tpot_p50_ms']:.2f}x | "
            f"{ratio['aggregate_tokens_per_s']:.2f}x |"
        )
    if "vs_plain" in w:
        rows += table_head(
            "concurrency",
            "standard tier / plain `vllm serve` (output speed)",
            "fast tier / plain `vllm serve`",
        )
        for level, ratio in w["vs_plain"].items():
            rows.append(f"| {level} | {ratio['standard']:.2f}x | {ratio['fast']:.2f}x |")
    if "acceptance" in w:
        a = w["acceptance"]
        rows += [
            "",
            f"Fast tier speculation: acceptance rate {a['acceptance_rate']:.3f}, "
            f"mean acceptance length {a['mean_acceptance_length']:.2f} "
            f"({int(a['draft_tokens'])} draft tokens).",
        ]
    return rows


def chart(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = [str(x) for x in r["levels"]]
    workloads = list(r["workloads"])
    fig, axes = plt.subplots(1, len(workloads), figsize=(5 * len(workloads), 4), squeeze=False)
    for ax, workload in zip(axes[0], workloads, strict=True):
        tiers = r["workloads"][workload]["tiers"]
        names = list(tiers)
        width = 0.8 / len(names)
        for n, tier in enumerate(names):
            values = [tiers[tier][lv]["per_request_tokens_per_s_p50"] for lv in levels]
            offset = (n - (len(names) - 1) / 2) * width
            ax.bar([i + offset for i in range(len(levels))], values, width=width, label=tier)
        ax.set_xticks(range(len(levels)), [f"c={lv}" for lv in levels])
        ax.set_title(f"{workload}: per-request tokens/s")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
