"""The fairness benchmark's report: its table against issue 52's targets, and a figure of
the gateway's limit and the engine's requests over time (``fairness-bench.png``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tiergate.bench.report import table_head

# Issue 52's targets: B's medians within 1.5x of B alone while A floods; each tenant's
# token share within 10% of its weight's share when both saturate.
SLOWDOWN_TARGET = 1.5
SHARE_TOLERANCE = 0.10


def command_line(params: Any) -> str:
    return (
        f"tiergate bench fairness --engine {params.engine} --model {params.model} "
        f"--flood {params.flood} --samples {params.samples} --max-tokens {params.max_tokens} "
        f"--share-seconds {params.share_seconds:g}"
    )


def _met(ok: bool | None) -> str:
    return "n/a" if ok is None else ("yes" if ok else "**no**")


def render_fairness(r: dict[str, Any], command: str) -> str:
    hw = r["hardware"]
    p = r["params"]
    rows = [
        "# Fairness between tenants",
        "",
        f"Command: `{command}` ({r['seconds']:.0f} s)",
        "",
        f"CPU: {hw.get('cpu', 'unknown')} ({hw.get('cores', '?')} cores; ISA "
        f"{hw.get('isa', '?')}; family/model {hw.get('family', '?')}). "
        f"Engine {p['engine']}, model {p['model']}, "
        f"{p['max_tokens']} output tokens at most, greedy.",
        "",
        f"Tenants A and B: the same priority, {p['flood']} concurrent each. A keeps "
        f"{p['flood']} streams going; B sends {p['samples']} requests one after another. "
        "Each gateway is the benchmark's own, in front of the same engine, one after the "
        "other: first come, first served (flow control, fairness and the reserve off), "
        "then the defaults. Medians; B's ratios are against B alone in the same gateway. "
        "B is measured once the tier's gate has a slot free (flow control has met the "
        "flood; 'settled after' says how long from the flood's first tokens), and the "
        "output tokens/s are both tenants' while B was measured: what the bound costs.",
        *table_head(
            "gateway",
            "B alone TTFT / TPOT ms",
            "B while A floods TTFT / TPOT ms",
            "B's TTFT ratio",
            "B's TPOT ratio",
            f"within {SLOWDOWN_TARGET}x",
            "output tokens/s while A floods",
            "settled after s",
        ),
    ]
    for run in r["runs"]:
        alone, flood = run["phases"]["B alone"], run["phases"]["B while A floods"]
        ratio = run["b_slowdown"]
        ttft, tpot = ratio["b_ttft_ms"], ratio["b_tpot_ms"]
        ok = None if ttft is None or tpot is None else max(ttft, tpot) <= SLOWDOWN_TARGET
        rows.append(
            f"| {run['gateway']} | {alone['b_ttft_ms']} / {alone['b_tpot_ms']} | "
            f"{flood['b_ttft_ms']} / {flood['b_tpot_ms']} | {ttft}x | {tpot}x | {_met(ok)} | "
            f"{flood['output_tokens_per_s']} | {flood['settle_seconds']} |"
        )
    for run in r["runs"]:
        shares = run["shares"]
        if not shares:
            continue
        rows += [
            "",
            f"Both flooding ({run['gateway']} gateway), the requests that ended in "
            f"{shares['window_seconds']} s: weighted tokens (prompt 1, output 2), each "
            f"tenant's share against its weight's (within {SHARE_TOLERANCE:.0%} of it).",
            *table_head("tenant", "requests", "weighted tokens", "share", "weight's share", "met"),
        ]
        for tenant in ("a", "b"):
            t = shares[tenant]
            ok = abs(t["share"] - t["weight_share"]) <= SHARE_TOLERANCE * t["weight_share"]
            rows.append(
                f"| {tenant.upper()} | {t['requests']} | {t['tokens']:.0f} | {t['share']:.3f} | "
                f"{t['weight_share']:.3f} | {_met(ok)} |"
            )
    rows += [
        "",
        "Figure: `fairness-bench.png` (the tier's limit and the engine's running "
        "and waiting requests over time, per gateway).",
        "",
    ]
    return "\n".join(rows)


def chart(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = r["runs"]
    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4), squeeze=False)
    for ax, run in zip(axes[0], runs, strict=True):
        for phase, gauges in run["gauges"].items():
            if not gauges:
                continue
            t = [g[0] for g in gauges]
            ax.plot(t, [g[2] for g in gauges], label=f"engine running ({phase})")
            ax.plot(t, [g[3] for g in gauges], ":", label=f"engine waiting ({phase})")
            if run["gateway"] == "fair":
                ax.plot(t, [min(g[1], 40) for g in gauges], "--", label=f"tier limit ({phase})")
        ax.set_title(f"{run['gateway']} gateway")
        ax.set_xlabel("seconds")
        ax.set_ylabel("requests")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
