"""The soak benchmark's report (``soak-bench.md``) and its figure (``soak-bench.png``:
latency per tier, each process's memory and open files, the patient lane's limit and the jobs
queue's lag, over time, with every fault marked)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tiergate.bench.report import table_head

# At most this many violations are listed in the Markdown; the JSON keeps them all.
_MAX_VIOLATIONS = 50
# Above this many minutes the latency table shows every 5th minute and the last.
_MAX_MINUTES = 20
_EVERY = 5
# A fault's line colour, by kind; any other kind is grey.
_FAULT_COLOURS = {"kill": "red", "stop": "orange"}


def _cell(value: Any, spec: str = "") -> str:
    """A table cell: ``-`` for a missing value, else the value in the given format."""
    if value is None:
        return "-"
    return format(value, spec) if spec else f"{value}"


def _stack_and_rates(r: dict[str, Any]) -> str:
    """One sentence on what ran (the stack) and how hard it was pushed (the rates)."""
    stack = r.get("stack") or {}
    rates = r.get("rates") or {}
    parts = ", ".join(f"{name} {n}" for name, n in stack.items()) or "not described"
    sentence = f"The stack: {parts}."
    if rates:
        sentence += " Offered load: " + ", ".join(f"{k} {v:g}" for k, v in rates.items()) + "."
    return sentence


def _checks(r: dict[str, Any]) -> list[str]:
    """The history checks, one row per count, then the verdict and the violations."""
    checks: dict[str, dict[str, int]] = r.get("checks") or {}
    lines: list[str] = []
    if checks:
        lines += table_head("section", "count", "n")
        for section, counts in checks.items():
            for name, n in counts.items():
                lines.append(f"| {section} | {name} | {n} |")
    violations: list[str] = r.get("violations") or []
    lines += ["", "**PASSED**" if r.get("passed") else "**FAILED**"]
    if violations:
        lines[-1] += f": {len(violations)} violation{'s' if len(violations) != 1 else ''}."
        lines.append("")
        lines += [f"- {v}" for v in violations[:_MAX_VIOLATIONS]]
        if len(violations) > _MAX_VIOLATIONS:
            lines.append(f"- ... and {len(violations) - _MAX_VIOLATIONS} more (see the JSON).")
    else:
        lines[-1] += ": no violation."
    return lines


def _faults(r: dict[str, Any]) -> list[str]:
    """The faults injected, in order, with how long each target took to come back."""
    faults: list[dict[str, Any]] = r.get("faults") or []
    if not faults:
        return ["", "No fault was injected."]
    lines = ["", "Faults:"]
    lines += table_head("minute", "kind", "target", "seconds until back", "detail")
    for f in sorted(faults, key=lambda f: float(f["at_s"])):
        back = f.get("back_at_s")
        until = None if back is None else float(back) - float(f["at_s"])
        lines.append(
            f"| {float(f['at_s']) / 60:.1f} | {f['kind']} | {f['target']} "
            f"| {_cell(until, '.1f')} | {f.get('detail') or ''} |"
        )
    return lines


def _growth(r: dict[str, Any]) -> list[str]:
    """Each process's resident memory over its longest stretch after the warm-up without
    a restart (start and end of the stretch), and the rate between."""
    growth: dict[str, dict[str, Any]] = r.get("growth") or {}
    if not growth:
        return ["", "No memory growth was measured."]
    lines = [
        "",
        "Memory growth, over each process's longest stretch after the warm-up without a "
        "restart (none shown where that was under 5 minutes):",
    ]
    lines += table_head("process", "stretch, minutes", "start, MB", "end, MB", "% per hour")
    for name, g in growth.items():
        window = g.get("window_s")
        span = f"{window[0] / 60:.0f}-{window[1] / 60:.0f}" if window else "-"
        lines.append(
            f"| {name} | {span} | {_cell(g.get('rss_mb_after_warmup'), '.1f')} "
            f"| {_cell(g.get('rss_mb_end'), '.1f')} | {_cell(g.get('pct_per_hour'), '+.1f')} |"
        )
    return lines


def _latency(r: dict[str, Any]) -> list[str]:
    """Latency per tier per minute; above 20 minutes, every 5th minute and the last."""
    rows: list[dict[str, Any]] = r.get("latency") or []
    if not rows:
        return ["", "No request was timed."]
    minutes = sorted({int(row["minute"]) for row in rows})
    shown = set(minutes)
    lines = ["", "Latency per tier per minute:"]
    if len(minutes) > _MAX_MINUTES:
        shown = {m for i, m in enumerate(minutes) if i % _EVERY == 0} | {minutes[-1]}
        lines[-1] = (
            f"Latency per tier per minute ({len(minutes)} minutes; every {_EVERY}th shown, "
            "and the last):"
        )
    lines += table_head("minute", "tier", "count", "p50 ms", "p99 ms", "refused", "failed")
    for row in sorted(rows, key=lambda row: (int(row["minute"]), str(row["tier"]))):
        if int(row["minute"]) not in shown:
            continue
        lines.append(
            f"| {row['minute']} | {row['tier']} | {row['count']} "
            f"| {_cell(row.get('p50_ms'), '.1f')} | {_cell(row.get('p99_ms'), '.1f')} "
            f"| {row.get('refused', 0)} | {row.get('failed', 0)} |"
        )
    return lines


def render(r: dict[str, Any]) -> str:
    """The Markdown summary: what ran, whether the history checked out, the faults, the
    memory growth and the latency per minute."""
    minutes = float(r["duration_s"]) / 60
    warmup = float(r.get("warmup_s") or 0) / 60
    lines = [
        "# Soak: every surface at once, with faults",
        "",
        f"CPU: {r['cpu']} ({r['cores']} cores). Command: `{r['command']}`. Seed {r['seed']}; "
        f"engine: {r['engine']}; {minutes:g} minutes, the first {warmup:g} of them warm-up.",
        "",
        _stack_and_rates(r),
        *_checks(r),
        *_faults(r),
        *_growth(r),
        *_latency(r),
        "",
        "Figure: `soak-bench.png` (latency per tier, each process's memory and open files, the "
        "patient lane's limit and the jobs queue's lag, over time; every fault marked).",
        "",
    ]
    return "\n".join(lines)


def chart(r: dict[str, Any], path: Path) -> None:
    """Four panels over the minutes since the start: latency per tier (p50 solid, p99
    dashed), each process's resident memory, each process's open files, and the patient
    lane's limit against the jobs queue's lag; every fault is a vertical line in each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (lat, rss, files, lane) = plt.subplots(4, 1, figsize=(11, 13), sharex=True)

    rows: list[dict[str, Any]] = r.get("latency") or []
    tiers = sorted({str(row["tier"]) for row in rows})
    positive = False
    for i, tier in enumerate(tiers):
        mine = sorted((row for row in rows if row["tier"] == tier), key=lambda row: row["minute"])
        for key, style in (("p50_ms", "-"), ("p99_ms", "--")):
            points = [(row["minute"] + 0.5, row[key]) for row in mine if row.get(key) is not None]
            positive = positive or any(v > 0 for _, v in points)
            lat.plot(
                [p[0] for p in points],
                [p[1] for p in points],
                style,
                color=f"C{i % 10}",
                marker=".",
                label=f"{tier} {key.removesuffix('_ms')}",
            )
    if positive:
        lat.set_yscale("log")
    lat.set_ylabel("latency, ms")
    if tiers:
        lat.legend(fontsize=7, ncol=2)

    cmap = plt.get_cmap("tab20")
    processes: dict[str, list[list[float]]] = r.get("processes") or {}
    for i, (name, samples) in enumerate(sorted(processes.items())):
        t = [s[0] / 60 for s in samples]
        rss.plot(t, [s[1] for s in samples], color=cmap(i % 20), label=name)
        files.plot(t, [s[2] for s in samples], color=cmap(i % 20), label=name)
    rss.set_ylabel("resident memory, MB")
    files.set_ylabel("open files")
    if processes:
        rss.legend(fontsize=6, ncol=3)

    limits: list[list[float]] = r.get("lane") or []
    lags: list[list[float]] = r.get("queue_lag") or []
    lag = lane.twinx()
    if limits:
        lane.step([p[0] / 60 for p in limits], [p[1] for p in limits], where="post", color="C0")
    if lags:
        lag.plot([p[0] / 60 for p in lags], [p[1] for p in lags], color="C4")
    lane.set_ylabel("patient lane's limit", color="C0")
    lag.set_ylabel("jobs queue lag", color="C4")
    lane.set_xlabel("minutes since the start")

    warmup = float(r.get("warmup_s") or 0) / 60
    faults: list[dict[str, Any]] = r.get("faults") or []
    for ax in (lat, rss, files, lane):
        if warmup > 0:
            ax.axvline(warmup, color="black", linestyle=":", linewidth=0.8)
        for f in faults:
            colour = _FAULT_COLOURS.get(str(f["kind"]), "grey")
            at = float(f["at_s"]) / 60
            ax.axvline(at, color=colour, linewidth=0.8, alpha=0.8)
            if f["kind"] == "stop" and f.get("back_at_s") is not None:
                ax.axvspan(at, float(f["back_at_s"]) / 60, color=colour, alpha=0.12)
    for f in faults:
        lat.text(
            float(f["at_s"]) / 60,
            0.98,
            f" {f['target']}",
            transform=lat.get_xaxis_transform(),
            rotation=90,
            fontsize=7,
            va="top",
            ha="right",
            color=_FAULT_COLOURS.get(str(f["kind"]), "grey"),
        )

    verdict = "passed" if r.get("passed") else "FAILED"
    fig.suptitle(
        f"Soak, {float(r['duration_s']) / 60:g} minutes on {r['cpu']} ({r['cores']} cores), "
        f"{r['engine']}: {verdict}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
