"""A parity judgement stops once its verdict is decided (issue 53 item 3): every check must
pass, so a failed task comparison needs no teacher-forced scoring and no sampled answers,
and failed agreement needs no sampled answers. The two tiers are fakes of the serving path
(the module's request functions replaced), named as such; the statistics are the real ones."""

from __future__ import annotations

import pytest

from tiergate.evidence import ParitySummary
from tiergate.quant import parity
from tiergate.quant.parity import Endpoint, evaluate, render, summary
from tiergate.quant.tasks import TASKS, Task

STANDARD, FAST = Endpoint("http://standard", "m"), Endpoint("http://fast", "m")


class FakeTiers:
    """Answers per tier: ``fast_right`` of the tasks right on the fast tier (all of them on
    the standard one); scores that agree or not; counts of what was asked."""

    def __init__(self, fast_right: float, scores_agree: bool) -> None:
        self.fast_right = fast_right
        self.scores_agree = scores_agree
        self.scored = 0
        self.sampled = 0

    def answer(self, ep: Endpoint, task: Task) -> tuple[str, list[int], list[int]]:
        index = TASKS.index(task)
        right = ep is STANDARD or index < self.fast_right * len(TASKS)
        return ("right" if right else "wrong", [1, 2, 3], [4, 5, 6, 7])

    def scores(self, ep: Endpoint, prompt: object) -> tuple[list[int], parity.Scores]:
        self.scored += 1
        ids = [1, 2, 3, 4, 5, 6, 7]
        other = 9 if ep is FAST and not self.scores_agree else None
        scores: parity.Scores = [{}] + [
            {other: (-0.01, 1), ids[i]: (-5.0, 2)}
            if other is not None
            else {ids[i]: (-0.01, 1), 8: (-5.0, 2)}
            for i in range(1, len(ids))
        ]
        return ids, scores

    def sample(self, ep: Endpoint, task: Task, seed: int) -> float:
        self.sampled += 1
        return 1.0


@pytest.fixture
def tiers(monkeypatch: pytest.MonkeyPatch) -> FakeTiers:
    fake = FakeTiers(1.0, True)
    monkeypatch.setattr(parity, "_answer", fake.answer)
    monkeypatch.setattr(parity, "passes", lambda task, text: text == "right")
    monkeypatch.setattr(parity, "prompt_scores", fake.scores)
    monkeypatch.setattr(parity, "sampled_nll", fake.sample)
    return fake


def test_a_failed_task_comparison_stops_before_scoring_and_sampling(tiers: FakeTiers) -> None:
    tiers.fast_right = 0.5  # half the tasks lost: far past the margin
    report = evaluate(STANDARD, FAST, progress=lambda m: None)
    assert report["passed"] is False and report["stopped_after"] == "tasks"
    assert tiers.scored == 0 and tiers.sampled == 0
    assert report["checks"] == {
        "next_token_agreement": None,
        "kl_divergence": None,
        "tasks": False,
        "sampling": None,
    }
    ParitySummary(**summary(report))  # the decision file can hold it (no infinities)
    assert "not measured" in render(report, "t")


def test_failed_agreement_stops_before_sampling(tiers: FakeTiers) -> None:
    tiers.scores_agree = False
    report = evaluate(STANDARD, FAST, progress=lambda m: None)
    assert report["passed"] is False and report["stopped_after"] == "scoring"
    assert tiers.scored > 0 and tiers.sampled == 0
    assert report["checks"]["next_token_agreement"] is False
    assert report["checks"]["tasks"] is True and report["checks"]["sampling"] is None
    ParitySummary(**summary(report))


def test_a_pass_is_the_whole_judgement(tiers: FakeTiers) -> None:
    report = evaluate(STANDARD, FAST, progress=lambda m: None)
    assert report["passed"] is True and report["stopped_after"] is None
    assert tiers.scored > 0 and tiers.sampled > 0
    assert all(v is True for v in report["checks"].values())
