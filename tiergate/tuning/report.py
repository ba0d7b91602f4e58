"""The tier decision as Markdown: what the fast tier runs here, and every candidate's
figures (``tiergate tune`` prints it and writes it beside the decision)."""

from __future__ import annotations

import time

from tiergate.evidence import CandidateResult, TierDecision


def _speeds(values: dict[str, float], fmt: str) -> str:
    return " / ".join(fmt.format(values[k]) for k in sorted(values, key=int)) or "-"


def _speed_cell(r: CandidateResult, screening_mode: str | None) -> str:
    speeds = _speeds(r.speedup, "{:.2f}x")
    if not r.screened_speedup:
        return speeds
    return (
        f"{speeds} as served (screened {screening_mode}: {_speeds(r.screened_speedup, '{:.2f}x')})"
    )


def _parity(r: CandidateResult) -> str:
    if r.parity is None:
        return "not judged"
    p = r.parity
    if p.stopped_after == "tasks":
        return f"FAIL (tasks {p.task_difference:+.3f}; stopped there, {p.seconds:.0f} s)"
    if p.stopped_after == "scoring":
        return (
            f"FAIL (agreement {p.next_token_agreement:.3f}, KL {p.kl_mean:.4f}, tasks "
            f"{p.task_difference:+.3f}; stopped before sampling, {p.seconds:.0f} s)"
        )
    return (
        f"{'pass' if p.passed else 'FAIL'} (agreement {p.next_token_agreement:.3f}, "
        f"KL {p.kl_mean:.4f}, tasks {p.task_difference:+.3f}, "
        f"sampled NLL {p.sampled_nll_gap:+.3f})"
    )


def render_decision(d: TierDecision) -> str:
    f = d.fingerprint
    levels = sorted({k for r in d.candidates for k in r.speedup}, key=int)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(d.decided_at))
    lines = [
        "# Tier decision",
        "",
        f"Fast tier: **{d.recipe_name}** ({d.verdict}). {d.reason}.",
        "",
        f"Measured {when} in {d.seconds:.0f} s on {f['cpu']} ({f['cores']} cores; ISA "
        f"{f['isa']}; GPU {f['gpu']}), vLLM {f['vllm']}, torch {f['torch']}, "
        f"{d.engine_mode} engines"
        + (
            f" (candidates screened with {d.screening_mode} engines; a recipe is chosen "
            f"only after it is measured again {d.engine_mode}, whose figures it then shows)."
            if d.screening_mode
            else "."
        ),
        "",
        (
            "Time: "
            + ", ".join(f"{k} {v:.0f} s" for k, v in d.phase_seconds.items())
            + (
                f"; {d.rounds_measured_again} timed round(s) measured again because users' "
                "requests shared them"
                if d.rounds_measured_again
                else ""
            )
            + "."
            if d.phase_seconds
            else ""
        ),
        "",
        f"| candidate | status | speedup at concurrency {' / '.join(levels)} "
        "| TPOT ms (standard -> candidate) | acceptance | parity |",
        "|---|---|---|---|---|---|",
    ]
    for r in d.candidates:
        tpot = (
            " / ".join(
                f"{r.standard_tpot_ms[k]:.1f} -> {r.tpot_ms[k]:.1f}"
                for k in sorted(r.tpot_ms, key=int)
            )
            or "-"
        )
        acceptance = f"{r.acceptance_rate:.2f}" if r.acceptance_rate is not None else "-"
        lines.append(
            f"| {r.recipe.name} | {r.status}{f' ({r.note})' if r.note else ''} | "
            f"{_speed_cell(r, d.screening_mode)} | {tpot} | {acceptance} | {_parity(r)} |"
        )
    return "\n".join([*lines, ""])
