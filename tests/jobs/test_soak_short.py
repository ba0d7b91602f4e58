"""``tiergate bench soak --short`` in the suite (issue 54): the chart's topology on this
machine (two gateway replicas behind nginx, Redis, two workers, the broker, the store, a
stand-in engine per tier), every surface driven at once for three and a half minutes while
eight kinds of fault land on their schedule, and the history checked: nothing lost, nothing answered
twice, nothing hung, every refusal typed, no tenant's marker in another's answers."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from tiergate.bench.soak.bench import SHORT, run_soak
from tiergate.bench.soak.report import chart


def test_a_short_soak_with_faults_loses_nothing_and_answers_everything_once(
    tmp_path: Path,
) -> None:
    report = run_soak(tmp_path, SHORT)
    assert report["violations"] == [], report["violations"][:10]
    assert report["passed"]
    # Every planned fault landed, and its target came back.
    assert sorted((f["kind"], f["target"]) for f in report["faults"]) == sorted(SHORT.kinds)
    landed = ("restarted", "SIGCONT", "filled, then emptied", "then none")
    assert all(any(w in f["detail"] for w in landed) for f in report["faults"]), report["faults"]
    checks = report["checks"]
    # The load was real on every surface, and what was accepted was checked.
    assert checks["interactive"]["answered"] > 100
    assert checks["interactive"]["responses_api_answered"] > 10
    assert checks["interactive"]["streams_answered"] > 30
    assert checks["jobs"]["accepted"] >= 10 and checks["jobs"]["hostile_accepted"] >= 1
    assert checks["jobs"]["ended_once"] == checks["jobs"]["accepted"]
    assert checks["batch_lines"]["lines"] >= SHORT.rates.batch_lines
    assert checks["batch_lines"]["answered_once"] == checks["batch_lines"]["lines"]
    assert checks["event_streams"]["streams"] >= 1
    assert checks["rollout_batches"]["batches"] == checks["rollout_batches"]["ended"] >= 1
    assert checks["rollout_batches"]["groups_taken"] >= 4  # each task's first round at least
    assert {"gateway-1", "worker-1", "broker", "redis"} <= set(report["processes"])
    with gzip.open(tmp_path / "soak-history.jsonl.gz", "rt") as history:
        kinds = {json.loads(line)["kind"] for line in history}
    assert {"chat", "job", "batch", "events", "rollouts", "fault"} <= kinds
    markdown = (tmp_path / "soak-bench.md").read_text()
    assert "**PASSED**" in markdown and report["cpu"] in markdown
    chart(report, tmp_path / "soak-bench.png")
    assert (tmp_path / "soak-bench.png").read_bytes()[:4] == b"\x89PNG"
