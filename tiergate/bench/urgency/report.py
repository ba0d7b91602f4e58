"""The urgency benchmark's Markdown: the medians against the three targets, then every
round's figures."""

from __future__ import annotations

from typing import Any

from tiergate.bench.urgency.bench import UrgencyBenchParams

_TARGETS = (
    ("shared_engines", "(a) standard requests use both engines", "{:.2f}x"),
    ("priority_first", "(b) a priority request starts before the queued ones", "{:.2f}x idle"),
    ("flex_last", "(c) a flex request starts after the queued ones", "{:g} standard after it"),
)


def command_line(params: UrgencyBenchParams) -> str:
    """The command that reproduces the run."""
    engines = " ".join(f"--engines {e}" for e in params.engines)
    return (
        f"tiergate bench urgency {engines} --model {params.model} --capacity {params.capacity} "
        f"--backlog {params.backlog_requests} --max-tokens {params.max_tokens} "
        f"--rounds {params.rounds}"
    )


def render_urgency(r: dict[str, Any], command: str) -> str:
    hw = r.get("hardware", {})
    s = r["summary"]
    g = r["gateway"]
    rows = [
        "# Urgency and shared engines",
        "",
        f"Command: `{command}`",
        "",
        f"CPU: {hw.get('cpu', 'unknown')} ({hw.get('cores', '?')} cores; ISA "
        f"{hw.get('isa', '?')}). Model {r['model']}, engines {', '.join(r['engines'])}, "
        f"{r['max_tokens']} output tokens at most, greedy; {r['rounds']} rounds, medians.",
        "",
        f"The benchmark's own gateway: every engine in both tiers' pools, engine priorities "
        f"{'on' if g['engine_priorities'] else 'off'}, the standard tier admitting "
        f"{g['standard_max_concurrent']} at once; the backlog is {r['backlog']} standard "
        f"requests, so {max(0, r['backlog'] - r['capacity'])} wait in the gateway's queue.",
        "",
        "| target | figure | met |",
        "|---|---|---|",
    ]
    for key, what, shown in _TARGETS:
        t = s["targets"][key]
        rows.append(f"| {what}: {t['target']} | {shown.format(t['value'])} | {_yes(t['met'])} |")
    rows += [
        "",
        "| figure (median over rounds) | value |",
        "|---|---|",
        f"| {r['capacity']} requests straight to one engine, aggregate tokens/s | "
        f"{s['single_tokens_per_s']:.1f} |",
        f"| the same through the gateway (standard tier), aggregate tokens/s | "
        f"{s['shared_tokens_per_s']:.1f} |",
        f"| shared / single | {s['shared_vs_single']:.2f}x |",
        f"| priority TTFT, idle (ms) | {s['idle_priority_ttft_ms']:.0f} |",
        f"| priority TTFT, in the backlog (ms) | {s['backlog_priority_ttft_ms']:.0f} |",
        f"| flex TTFT, idle (ms) | {s['idle_flex_ttft_ms']:.0f} |",
        f"| flex TTFT, in the backlog (ms) | {s['backlog_flex_ttft_ms']:.0f} |",
        "",
        "Per round. The backlog: the standard tier's slots filled and streaming, then a flex "
        "request queued, then the other standard requests queued behind it, then a priority "
        "request. *Queued*: the standard requests without a first token when the priority "
        "request was sent.",
        "",
        "| round | one engine tokens/s | gateway tokens/s | ratio | in flight per engine | "
        "priority TTFT idle / backlog (ms) | ratio | queued standard first / queued | "
        "flex TTFT idle / backlog (ms) | standard after flex (flex after the last, ms) | "
        "backlog as planned |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n, x in enumerate(r["per_round"], 1):
        b = x["backlog"]
        spread = " / ".join(f"{v:g}" for v in x["shared_in_flight_per_engine"].values()) or "?"
        rows.append(
            f"| {n} | {x['single_tokens_per_s']:.1f} | {x['shared_tokens_per_s']:.1f} | "
            f"{x['shared_vs_single']:.2f}x | {spread} | {x['idle_priority_ttft_ms']:.0f} / "
            f"{b['priority_ttft_ms']:.0f} | {b['priority_ttft_vs_idle']:.2f}x | "
            f"{b['queued_standard_first_before_priority']} / {b['queued_when_priority_sent']} | "
            f"{x['idle_flex_ttft_ms']:.0f} / {b['flex_ttft_ms']:.0f} | "
            f"{b['standard_first_after_flex']} ({_ms(b['flex_first_after_last_standard_ms'])}) | "
            f"{_yes(b['as_planned'])} |"
        )
    if s["rounds_as_planned"] < len(r["per_round"]):
        rows += [
            "",
            f"Only {s['rounds_as_planned']} of {len(r['per_round'])} backlogs went as planned: "
            "in the others a slot came free before every request was seen queued, so their "
            "order says less (a larger --max-tokens gives a longer window).",
        ]
    rows += [
        "",
        "Targets are reported, not asserted: a benchmark measures. Every request's send and "
        "first-token times are in the JSON report (`per_round[].backlog.samples`).",
    ]
    return "\n".join([*rows, ""])


def _ms(value: float | None) -> str:
    return "?" if value is None else f"{value:+.0f}"


def _yes(met: bool | None) -> str:
    return "-" if met is None else "yes" if met else "**no**"
