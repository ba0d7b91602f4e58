"""``tiergate bench rollouts --short`` end to end (a smoke: servers of its own, a real
broker, store, workers and sandbox with the stand-in model; no timed assertions): both
schedules' batches complete, every group is counted, and the report and figure say so."""

from __future__ import annotations

from pathlib import Path

from tiergate.bench.rollouts.bench import SHORT, run_rollouts_benchmark
from tiergate.bench.rollouts.report import chart


def test_the_rollouts_benchmark_runs_both_schedules_and_reports_them(tmp_path: Path) -> None:
    report = run_rollouts_benchmark(tmp_path, SHORT)
    assert set(report["runs"]) == {"per_task", "rounds"}
    for schedule, run in report["runs"].items():
        assert run["status"] == "completed", schedule
        # Every task's round is one group: 6 tasks' first rounds at least, each complete.
        assert SHORT.tasks <= run["groups"] == len(run["completions_s"]), schedule
        assert run["rollouts"] == run["groups"] * SHORT.samples, schedule
        assert 0 < run["slot_utilization_while_samples_remain"] <= 1, schedule
        assert run["first_group_s"] <= run["makespan_s"], schedule
    assert report["slow_task_seconds"] > report["warmup_median_rollout_s"]
    markdown = (tmp_path / "rollouts-bench.md").read_text()
    assert report["cpu"] in markdown and "| groups per minute, to the last |" in markdown
    chart(report, tmp_path / "rollouts-bench.png")
    assert (tmp_path / "rollouts-bench.png").read_bytes()[:4] == b"\x89PNG"
