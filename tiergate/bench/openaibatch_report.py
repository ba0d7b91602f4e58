"""The Markdown of ``tiergate bench batch`` (tiergate.bench.openaibatch)."""

from __future__ import annotations

from typing import Any

BATCH_GOAL = 0.8  # the batch's output tokens/s against vLLM's run-batch, at least
LATENCY_GOAL = 1.5  # an interactive request's TTFT and TPOT while the batch runs, at most


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _met(value: float | None, goal: float, at_least: bool) -> str:
    if value is None:
        return "-"
    return "yes" if (value >= goal if at_least else value <= goal) else "no"


def render_batch(result: dict[str, Any], command: str) -> str:
    hw, p, r = result["hardware"], result["params"], result["ratios"]
    idle, ours, base = result["idle"], result["tiergate"], result["run_batch"]
    busy = ours["busy"]
    lines = [
        "# The Batch API: throughput and the interactive lane",
        "",
        f"Command: `{command}`",
        "",
        f"CPU: {hw.get('cpu', 'unknown')} ({hw.get('cores', '?')} cores; ISA "
        f"{hw.get('isa', '?')}), vLLM {hw.get('vllm', '?')}, torch {hw.get('torch', '?')}. "
        f"Model {p['model']}; {p['lines']} chat lines of exactly {p['max_tokens']} output "
        f"tokens each; interactive requests of {p['probe_tokens']} tokens, one at a time. "
        f"The stack's batch lane: {result.get('lane') or 'not read'}.",
        "",
        "| target | figure | met |",
        "|---|---|---|",
        f"| the batch's output tokens/s against vLLM's run-batch >= {BATCH_GOAL}x | "
        f"{_x(r['batch_vs_run_batch'])} | {_met(r['batch_vs_run_batch'], BATCH_GOAL, True)} |",
        f"| interactive TTFT while the batch runs <= {LATENCY_GOAL}x idle | "
        f"{_x(r['ttft_busy_vs_idle'])} | {_met(r['ttft_busy_vs_idle'], LATENCY_GOAL, False)} |",
        f"| interactive TPOT while the batch runs <= {LATENCY_GOAL}x idle | "
        f"{_x(r['tpot_busy_vs_idle'])} | {_met(r['tpot_busy_vs_idle'], LATENCY_GOAL, False)} |",
        "",
        "| run | lines completed / failed | seconds | output tokens | output tokens/s |",
        "|---|---|---|---|---|",
        f"| tiergate batch ({ours['status']}) | {ours['completed']} / {ours['failed']} | "
        f"{ours['seconds']:.1f} | {ours['output_tokens']} | {ours['output_tokens_per_s']:.1f} |",
    ]
    if base is not None:
        lines.append(
            f"| vLLM run-batch, standard engine's configuration | {base['completed']} / "
            f"{base['failed']} | {base['seconds']:.1f} | {base['output_tokens']} | "
            f"{base['output_tokens_per_s']:.1f} |"
        )
    lines += [
        "",
        "| interactive requests (medians) | requests | TTFT ms | TPOT ms |",
        "|---|---|---|---|",
        f"| idle | {idle['requests']} | {idle['ttft_p50_ms']:.0f} | {idle['tpot_p50_ms']:.1f} |",
        f"| while the batch runs | {busy['requests']} | {busy['ttft_p50_ms']:.0f} | "
        f"{busy['tpot_p50_ms']:.1f} |",
        "",
        _limit_line(ours.get("patient_lane_limit")),
        "",
        "The tiergate batch's seconds run from create to the poll (every second) that saw it "
        "final; run-batch's from its engine loaded to its output file written. Goals are "
        "reported, not asserted: a benchmark measures.",
        "",
    ]
    return "\n".join(lines)


def _limit_line(limit: dict[str, float] | None) -> str:
    if limit is None:
        return "The gateway's patient-lane limit was not read (its /metrics did not answer)."
    return (
        "The gateway's patient-lane limit (admission.patient) while the batch ran, read every "
        f"second: median {limit['median']:g}, from {limit['min']:g} to {limit['max']:g}."
    )
