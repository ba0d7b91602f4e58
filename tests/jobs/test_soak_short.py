"""``tiergate bench soak --short`` in the suite (issue 54): the chart's topology on this
machine (two gateway replicas behind nginx, Redis, two workers, the broker, the store, a
stand-in engine per tier), every surface driven at once for three and a half minutes while
eight kinds of fault land on their schedule, and the history checked: nothing lost, nothing answered
twice, nothing hung, every refusal typed, no tenant's marker in another's answers."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.waiting import eventually
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


def _children() -> dict[int, int]:
    """Every live process's parent, from /proc."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":  # a zombie has ended (its parent, perhaps init, reaps it)
            parents[int(stat.parent.name)] = int(fields[1])
    return parents


def _descendants(root: int) -> set[int]:
    parents = _children()
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def test_a_soak_stopped_with_sigterm_stops_everything_it_started(tmp_path: Path) -> None:
    """``timeout``, a cancelled CI job or ``kill`` stop a benchmark with SIGTERM: the soak
    stops its stack on the way out (it left its engines, gateways and servers running)."""
    log = (tmp_path / "soak.log").open("wb")
    started: set[int] = set()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tiergate", "bench", "soak", "--short", "--out", str(tmp_path)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        # Started: the store, broker, Redis, two engines, two gateways, nginx, two workers.
        eventually(
            lambda: "min:" in (tmp_path / "soak.log").read_text(),
            180,
            1.0,
            lambda: (tmp_path / "soak.log").read_text()[-2000:],
        )
        started = _descendants(proc.pid)
        assert len(started) >= 9, started
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
        eventually(
            lambda: not (started & set(_children())),
            60,
            0.5,
            lambda: f"still running: {sorted(started & set(_children()))}",
        )
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in started & set(_children()):  # what it left behind, so the suite goes on
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        log.close()
