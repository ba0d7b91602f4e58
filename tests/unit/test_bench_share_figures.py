"""The fleet-share benchmark's verdict (tiergate bench share), from samples made up here:
what it judges is the time after the first key's running jobs could have ended."""

from __future__ import annotations

from tiergate.bench.jobs.share import Sample, ShareBenchParams, _figures, render

PARAMS = ShareBenchParams(jobs_per_key=10, job_seconds=20, workers=2, share=0.5)


def _sample(at: float, alice: int, bob: int, bob_waiting: int = 5) -> Sample:
    return Sample(at, {"alice": alice, "bob": bob}, {"alice": 5, "bob": bob_waiting})


def test_the_share_holds_when_alice_keeps_to_it_once_her_first_jobs_have_ended() -> None:
    # Before 30 s (20 s jobs + 10 s of refresh) Alice still runs her four: not judged.
    samples = [_sample(1, 4, 0), _sample(25, 3, 1), _sample(31, 2, 2), _sample(40, 2, 2)]
    report = _figures(PARAMS, "cpu", 4, samples, told=3, twice=[])
    assert report["share_cap"] == 2 and report["settled_samples"] == 2
    assert report["share_held"] is True
    assert report["alice_running_while_bob_waits"] == {"min": 2, "median": 2, "max": 2}
    assert report["bob_reached_his_share_after_s"] == 31
    assert "Share held: **yes**" in render(report)


def test_alice_over_her_share_while_bob_waits_is_a_failure() -> None:
    samples = [_sample(31, 2, 2), _sample(35, 3, 1)]
    report = _figures(PARAMS, "cpu", 4, samples, told=0, twice=[])
    assert report["share_held"] is False and "Share held: **NO**" in render(report)


def test_no_sample_while_bob_waits_proves_nothing() -> None:
    samples = [_sample(31, 2, 2, bob_waiting=0)]
    assert _figures(PARAMS, "cpu", 4, samples, told=0, twice=[])["share_held"] is False
