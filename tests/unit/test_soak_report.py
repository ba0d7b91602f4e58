"""The soak benchmark's report and figure (tiergate bench soak), from a made-up run of three
minutes: what a reader checks in the Markdown, and that the figure is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tiergate.bench.soak.report import chart, render


def _report() -> dict[str, Any]:
    latency = [
        {
            "minute": m,
            "tier": tier,
            "count": 0 if (m, tier) == (2, "batch") else 50,
            "p50_ms": None if (m, tier) == (2, "batch") else 10.0 + m,
            "p99_ms": None if (m, tier) == (2, "batch") else 80.0 + m,
            "refused": 1,
            "failed": 0,
        }
        for m in range(3)
        for tier in ("standard", "batch")
    ]
    return {
        "command": "tiergate bench soak --minutes 3",
        "cpu": "AMD EPYC (family 26 model 2)",
        "cores": 2,
        "seed": 7,
        "duration_s": 180.0,
        "warmup_s": 30.0,
        "engine": "stand-in",
        "stack": {"gateways": 1, "workers": 1},
        "rates": {"chat_per_s": 2.0, "jobs_per_min": 6.0},
        "faults": [
            {
                "at_s": 60.0,
                "kind": "kill",
                "target": "worker-1",
                "back_at_s": 63.5,
                "detail": "SIGKILL; restarted",
            },
            {
                "at_s": 120.0,
                "kind": "stop",
                "target": "gateway-1",
                "back_at_s": 130.0,
                "detail": "SIGSTOP for 10 s",
            },
        ],
        "latency": latency,
        "processes": {
            "gateway-1": [[t, 80.0 + t / 60, 20 + t // 60] for t in (0.0, 60.0, 120.0, 180.0)],
            "worker-1": [[t, 120.0, 30] for t in (0.0, 60.0, 120.0, 180.0)],
        },
        "growth": {
            "gateway-1": {
                "rss_mb_after_warmup": 80.5,
                "rss_mb_end": 83.0,
                "pct_per_hour": 62.1,
                "window_s": [60.0, 180.0],
            },
            "worker-1": {"rss_mb_after_warmup": 120.0, "rss_mb_end": 120.0, "pct_per_hour": None},
        },
        "lane": [[0.0, 4], [60.0, 2], [120.0, 4]],
        "queue_lag": [[0.0, 0], [90.0, 3], [150.0, 1]],
        "checks": {
            "interactive": {"sent": 300, "answered": 294, "refused_typed": 6, "untyped": 0},
            "jobs": {"accepted": 18, "ended_once": 17, "lost": 0, "duplicated": 1},
        },
        "violations": ["job job_x ended twice"],
        "passed": False,
    }


def test_the_markdown_says_what_a_reader_checks() -> None:
    md = render(_report())
    assert md.startswith("# Soak: every surface at once, with faults")
    assert "**FAILED**: 1 violation." in md and "- job job_x ended twice" in md
    assert "| 1.0 | kill | worker-1 | 3.5 | SIGKILL; restarted |" in md
    assert "| 2.0 | stop | gateway-1 | 10.0 | SIGSTOP for 10 s |" in md
    assert "| gateway-1 | 1-3 | 80.5 | 83.0 | +62.1 |" in md
    assert "| worker-1 | - | 120.0 | 120.0 | - |" in md
    assert "| jobs | duplicated | 1 |" in md
    assert "| 2 | batch | 0 | - | - | 1 | 0 |" in md
    assert "`soak-bench.png`" in md


def test_a_long_run_shows_every_fifth_minute_and_the_last() -> None:
    r = _report()
    r["latency"] = [
        {"minute": m, "tier": "standard", "count": 1, "p50_ms": 1.0, "p99_ms": 2.0}
        for m in range(23)
    ]
    md = render(r)
    shown = [line.split(" | ")[0] for line in md.splitlines() if line.endswith("| 0 | 0 |")]
    assert shown == ["| 0", "| 5", "| 10", "| 15", "| 20", "| 22"]
    assert "every 5th shown, and the last" in md


def test_render_tolerates_the_optional_parts_missing() -> None:
    r = _report()
    r.update(faults=[], lane=[], queue_lag=[], growth={}, violations=[], passed=True)
    md = render(r)
    assert "**PASSED**: no violation." in md
    assert "No fault was injected." in md and "No memory growth was measured." in md


def test_the_chart_is_a_png(tmp_path: Path) -> None:
    out = tmp_path / "soak-bench.png"
    chart(_report(), out)
    assert out.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    empty = tmp_path / "empty.png"
    r = _report()
    r.update(faults=[], lane=[], queue_lag=[], growth={})
    chart(r, empty)
    assert empty.stat().st_size > 0


def test_growth_is_fitted_over_the_longest_stretch_without_a_restart() -> None:
    """A process restarted late would otherwise show its own warm-up as growth."""
    from tiergate.bench.soak.bench import growth

    # Flat at 100 MB from the warm-up (600 s) to a restart at 2400 s; then a fresh process
    # climbing from 50 MB (its warm-up) to the end.
    series = [[float(t), 100.0] for t in range(600, 2400, 10)]
    series += [[float(t), 50.0 + (t - 2400) / 10] for t in range(2410, 3600, 10)]
    g = growth(series, 600.0, [(2395.0, 2400.0)])
    assert g["window_s"] == [600.0, 2390.0]
    assert g["pct_per_hour"] == 0.0
    # A stretch under five minutes is not fitted.
    assert growth(series[:20], 600.0, [])["pct_per_hour"] is None
