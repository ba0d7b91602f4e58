"""The rollouts benchmark's report (``rollouts-bench.md``) and its figure
(``rollouts-bench.png``: slot occupancy and complete groups over time, per schedule)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tiergate.bench.report import table_head

_ROWS = (
    ("rollouts", "rollouts run"),
    ("groups", "complete groups (a task's samples of one round)"),
    ("makespan_s", "seconds to the last group"),
    ("groups_per_minute", "groups per minute, to the last"),
    ("time_to_90pct_groups_s", "seconds to 90% of the groups"),
    ("groups_per_minute_to_90pct", "groups per minute, to 90% of them"),
    ("first_group_s", "seconds to the first group"),
    ("median_rollout_s", "median rollout, seconds"),
    ("slot_utilization_while_samples_remain", "slot utilization while samples remain"),
)


def _cell(value: Any) -> str:
    return "-" if value is None else f"{value}"


def render(r: dict[str, Any]) -> str:
    p = r["parameters"]
    runs = r["runs"]
    first = f"first_{p['first_n']}_groups_s"
    lines = [
        "# Rollout batches: each task on its own against the round barrier",
        "",
        f"CPU: {r['cpu']} ({r['cores']} cores). Command: `{r['command']}`.",
        "",
        f"{p['tasks']} tasks, {p['slow_tasks']} of them slow ({p['slow_share']:.0%}), "
        f"{p['samples']} samples each, up to {p['rounds']} rounds (a task whose samples so far "
        f"all passed or all failed is saturated; the verifier flips a coin), {p['slots']} "
        f"slots, `max_in_flight` {p['max_in_flight']}. The warm-up's median rollout was "
        f"{r['warmup_median_rollout_s']} s; the slow tasks sleep {r['slow_task_seconds']} s, "
        f"so that their rollouts take about {p['slow_factor']:g}x that. The stand-in model "
        "answers each step at once: a rollout's time is its command's and the stack's.",
        *table_head("figure", "per_task", "rounds", "per_task / rounds"),
    ]
    ratios = {
        "groups_per_minute": r["ratios"]["groups_per_minute"],
        "groups_per_minute_to_90pct": r["ratios"]["groups_per_minute_to_90pct"],
        "slot_utilization_while_samples_remain": r["ratios"]["slot_utilization"],
    }
    for key, label in (*_ROWS, (first, f"seconds to the first {p['first_n']} groups")):
        a, b = runs["per_task"].get(key), runs["rounds"].get(key)
        ratio = ratios.get(key)
        lines.append(
            f"| {label} | {_cell(a)} | {_cell(b)} | {'-' if ratio is None else f'{ratio}x'} |"
        )
    lines += [
        "",
        "The makespan is bounded under either schedule by the slowest task's own chain of "
        "rounds; the rate to 90% of the groups is what a trainer taking groups as they "
        "complete sees before that tail.",
        "",
        "Figure: `rollouts-bench.png` (rollouts holding a slot, and complete groups, over "
        "time, per schedule).",
        "",
    ]
    return "\n".join(lines)


def chart(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (occ, grp) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for schedule, run in r["runs"].items():
        t = [o[0] for o in run["occupancy"]]
        occ.step(t, [o[1] for o in run["occupancy"]], where="post", label=schedule)
        done = run["completions_s"]
        grp.step([0.0, *done], list(range(len(done) + 1)), where="post", label=schedule)
    occ.axhline(r["parameters"]["slots"], color="grey", linestyle=":", label="slots")
    occ.set_ylabel("rollouts holding a slot")
    occ.legend(fontsize=8)
    grp.set_ylabel("complete groups")
    grp.set_xlabel("seconds after the submission")
    grp.legend(fontsize=8)
    fig.suptitle(
        f"{r['parameters']['tasks']} tasks, {r['parameters']['slow_tasks']} slow; {r['cpu']}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
