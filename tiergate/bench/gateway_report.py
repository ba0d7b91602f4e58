"""The gateway benchmark's Markdown report."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

# A run whose direct saturation is this far off the median ran beside something else.
DISTURBED_SPREAD = 0.15

# The gateway's overhead targets (issue 22), each judged within one run against that run's
# own vllm-router: saturation per core at least this share of vllm-router's; added p50 at
# the fixed rate at most vllm-router's plus this; chunk lateness added under this.
SATURATION_SHARE = 0.5
FIXED_RATE_MARGIN_MS = 0.5
LATENESS_LIMIT_MS = 0.5


def targets(derived: dict[str, Any], system: str = "tiergate") -> dict[str, dict[str, Any]]:
    """The three targets for one run's derived figures: each with the figure, its bound
    and whether it was met."""
    ours, router = derived[system], derived["vllm-router"]
    saturation = float(ours["saturation_vs_vllm_router"])
    p50 = float(ours["added"]["fixed_rate_p50_ms"])
    p50_bound = float(router["added"]["fixed_rate_p50_ms"]) + FIXED_RATE_MARGIN_MS
    lateness = float(ours["added"]["stream_lateness_p50_ms"])
    return {
        "saturation_vs_vllm_router": {
            "value": saturation,
            "bound": SATURATION_SHARE,
            "met": saturation >= SATURATION_SHARE,
        },
        "fixed_rate_added_p50_ms": {"value": p50, "bound": p50_bound, "met": p50 <= p50_bound},
        "stream_lateness_added_p50_ms": {
            "value": lateness,
            "bound": LATENESS_LIMIT_MS,
            "met": lateness < LATENESS_LIMIT_MS,
        },
    }


def command_line(duration: float, repeat: int, workers: Sequence[int]) -> str:
    return (
        f"tiergate bench gateway --duration {duration:g} --repeat {repeat} "
        f"--workers {','.join(str(w) for w in workers)}"
    )


def render_markdown(r: dict[str, Any]) -> str:
    med = r["median"]
    systems: dict[str, Any] = med["systems"]
    derived: dict[str, Any] = med["derived"]
    names = list(systems)
    rate = f"{r['fixed_rate_rps']:g}"

    def row(label: str, values: list[str]) -> str:
        return f"| {label} | " + " | ".join(values) + " |"

    def col(get: Callable[[str], float], digits: int = 3, skip_direct: bool = False) -> list[str]:
        return ["" if skip_direct and n == "direct" else f"{get(n):.{digits}f}" for n in names]

    def added(key: str) -> Callable[[str], float]:
        return lambda n: float(derived[n]["added"][key])

    lines = [
        "# Gateway overhead beside vllm-router (zero-cost backend, same run)",
        "",
        f"CPU: {r['cpu_model']} ({r['cores']} cores). Command: `{r['command']}`. "
        f"Figures are medians of {r['repeat']} run(s); each proxy on core 0 (tiergate with "
        "more than one process on every core, shared with the load), backends and load on "
        "core 1. Saturation is taken in turns of about a second, the systems in rotation; "
        "the fixed rate of every system at once, their requests interleaved.",
        "",
        row("measurement", names),
        row("---", ["---"] * len(names)),
        row(
            "saturation, req/s (wrk, 32 connections)",
            col(lambda n: float(systems[n]["saturation"]["rps"]), 0),
        ),
        row(
            "saturation vs direct",
            col(lambda n: float(derived[n]["saturation_vs_direct"]), 3, True),
        ),
        row(
            "saturation vs vllm-router",
            [
                f"{derived[n]['saturation_vs_vllm_router']:.3f}"
                if n in derived and "saturation_vs_vllm_router" in derived[n]
                else ""
                for n in names
            ],
        ),
        row(f"at {rate} req/s, p50 (ms)", col(lambda n: float(systems[n]["fixed_rate_ms"]["p50"]))),
        row(f"at {rate} req/s, p99 (ms)", col(lambda n: float(systems[n]["fixed_rate_ms"]["p99"]))),
        row(f"at {rate} req/s, added p50 (ms)", col(added("fixed_rate_p50_ms"), 3, True)),
        row(f"at {rate} req/s, added p99 (ms)", col(added("fixed_rate_p99_ms"), 3, True)),
        row("one at a time, p50 (ms)", col(lambda n: float(systems[n]["sequential_ms"]["p50"]))),
        row("one at a time, added p50 (ms)", col(added("sequential_p50_ms"), 3, True)),
        row("one at a time, added p99 (ms)", col(added("sequential_p99_ms"), 3, True)),
        row(
            "gateway's own x-tiergate-overhead-ms, p50",
            [
                f"{systems[n]['reported_overhead_ms']['p50']:.3f}"
                if "reported_overhead_ms" in systems[n]
                else ""
                for n in names
            ],
        ),
        row("streaming: first chunk, added p50 (ms)", col(added("stream_ttfb_p50_ms"), 3, True)),
        row(
            "streaming: chunk lateness, p50 (ms)",
            col(lambda n: float(systems[n]["stream_chunk_lateness_ms"]["p50"])),
        ),
        row(
            "streaming: chunk lateness, added p50 (ms)",
            col(added("stream_lateness_p50_ms"), 3, True),
        ),
        row(
            "streaming: chunk lateness, added p99 (ms)",
            col(added("stream_lateness_p99_ms"), 3, True),
        ),
        "",
    ]
    if r["disturbed_runs"]:
        lines += [
            f"Disturbed: run(s) {r['disturbed_runs']} had a direct saturation more than "
            f"{DISTURBED_SPREAD:.0%} off the median (something else ran on the machine).",
            "",
        ]
    verdicts = [targets(run["derived"]) for run in r["runs"]]
    held = sum(all(t["met"] for t in v.values()) for v in verdicts)
    lines += [
        f"Targets, each run against its own vllm-router: all three held in {held} of "
        f"{len(verdicts)} run(s).",
        "",
        "| run | saturation vs vllm-router (at least "
        f"{SATURATION_SHARE:g}) | added p50 at {rate} req/s, ms (at most vllm-router's + "
        f"{FIXED_RATE_MARGIN_MS:g}) | chunk lateness added p50, ms (under "
        f"{LATENESS_LIMIT_MS:g}) |",
        "| --- | --- | --- | --- |",
        *(
            f"| {i + 1} | "
            + " | ".join(
                f"{t['value']:.3f}"
                + (f" (bound {t['bound']:.3f})" if name == "fixed_rate_added_p50_ms" else "")
                + (": met" if t["met"] else ": missed")
                for name, t in v.items()
            )
            + " |"
            for i, v in enumerate(verdicts)
        ),
        "",
        f"Per run, saturation req/s ({' / '.join(names)}):",
        "",
        *(
            f"- run {i + 1}: "
            + " / ".join(f"{run['systems'][n]['saturation']['rps']:.0f}" for n in names)
            for i, run in enumerate(r["runs"])
        ),
        "",
    ]
    return "\n".join(lines)
