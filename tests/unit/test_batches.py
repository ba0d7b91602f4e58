"""Rollout batches' pure parts: reward normalization against hand-computed values, and the
scheduler's decisions (rounds, saturation, weights, budget, cancel, failing domains)."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from tiergate.jobs.batches.driver import job_id_of
from tiergate.jobs.batches.export import conversation
from tiergate.jobs.batches.rewards import normalize
from tiergate.jobs.batches.schedule import Sample, decide
from tiergate.protocol.batches import Batch, BatchCreate, Rollout


def _task(domain: str, task_id: str) -> dict[str, str]:
    return {"model": "m", "instruction": f"do {task_id}", "domain": domain, "task_id": task_id}


def _spec(**kw: object) -> BatchCreate:
    tasks = kw.pop("tasks", [_task("code", "a"), _task("code", "b"), _task("docs", "c")])
    return BatchCreate.model_validate({"tasks": tasks, **kw})


def _batch(spec: BatchCreate) -> Batch:
    return Batch(
        id="batch_x",
        owner="o",
        created_at=0,
        samples_per_task=spec.samples_per_task,
        rounds=spec.rounds,
        schedule=spec.schedule,
    )


def _end(batch: Batch, passed: dict[tuple[str, int], bool]) -> None:
    for r in batch.rollouts:
        if (r.task_id, r.sample) in passed:
            r.status, r.passed = "completed", passed[(r.task_id, r.sample)]
            r.reward = 1.0 if r.passed else 0.0


def _roll(domain: str, task: str, sample: int, reward: float) -> Rollout:
    return Rollout(
        job_id=f"{domain}-{task}-{sample}",
        domain=domain,
        task_id=task,
        sample=sample,
        round=1,
        status="completed",
        passed=reward > 0,
        reward=reward,
    )


def test_group_and_domain_normalization_match_the_hand_computed_values() -> None:
    rollouts = [
        _roll("code", "a", 0, 1.0),
        _roll("code", "a", 1, 0.0),
        _roll("code", "a", 2, 0.0),
        _roll("code", "a", 3, 1.0),  # mean 0.5, std 0.5
        _roll("code", "b", 0, 1.0),
        _roll("code", "b", 1, 1.0),  # all passed: advantage 0
        _roll("math", "c", 0, 90.0),
        _roll("math", "c", 1, 10.0),  # mean 50, std 40
    ]
    out = normalize(rollouts, clip=5.0)
    a, z, n = out["code-a-0"]
    assert a == pytest.approx(0.5) and z == pytest.approx(1.0, rel=1e-5)
    # code's scale: sqrt((4 * 0.25 + 2 * 0) / 6) = sqrt(1/6)
    assert n == pytest.approx(0.5 / math.sqrt(1 / 6))
    assert out["code-b-1"] == (0.0, 0.0, 0.0)
    a, z, n = out["math-c-1"]
    assert a == pytest.approx(-40.0) and z == pytest.approx(-1.0, rel=1e-5)
    assert n == pytest.approx(-1.0)  # scale sqrt((1600 + 1600) / 2) = 40: alike to code's
    clipped = normalize(rollouts, clip=1.0)
    assert clipped["code-a-0"][2] == 1.0 and clipped["code-a-1"][2] == -1.0


def test_saturated_tasks_get_no_later_round_and_the_skip_says_why() -> None:
    spec = _spec(samples_per_task=2, rounds=2, max_in_flight=100)
    batch = _batch(spec)
    plan = decide(spec, batch, cancelled=False)
    assert len(plan.start) == 6
    _record(spec, batch, plan.start)
    _end(
        batch,
        {
            ("a", 0): True,
            ("a", 1): True,
            ("b", 0): True,
            ("b", 1): False,
            ("c", 0): False,
            ("c", 1): False,
        },
    )
    plan = decide(spec, batch, cancelled=False)
    assert batch.round == 2
    assert [(spec.tasks[s.task].task_id, s.sample, s.round) for s in plan.start] == [
        ("b", 2, 2),
        ("b", 3, 2),
    ]
    skipped = {(s.task_id, s.reason) for s in batch.skips}
    assert skipped == {("a", "saturated"), ("c", "saturated")}
    assert "all 2 samples passed" in next(s.detail for s in batch.skips if s.task_id == "a")


def _record(spec: BatchCreate, batch: Batch, plan_start: list[Sample]) -> None:
    for s in plan_start:
        t = spec.tasks[s.task]
        batch.rollouts.append(
            Rollout(
                job_id=job_id_of("b", s.task, s.sample),
                domain=t.domain,
                task_id=t.task_id,
                sample=s.sample,
                round=s.round,
            )
        )


def _started(spec: BatchCreate, plan_start: list[Sample]) -> list[tuple[str, int, int]]:
    return [(spec.tasks[s.task].task_id, s.sample, s.round) for s in plan_start]


def test_a_slow_task_never_delays_another_tasks_next_samples() -> None:
    """Issue 51: with the batch-wide barrier a quick task's round 2 waited for the slowest
    rollout of round 1; each task now goes on alone. The barrier is kept (schedule:
    rounds) and still waits, which is what the benchmark compares against."""
    tasks = [_task("code", "quick"), _task("code", "slow"), _task("docs", "solved")]
    for schedule, expected in (
        ("per_task", [("quick", 2, 2), ("quick", 3, 2)]),
        ("rounds", []),
    ):
        spec = _spec(
            tasks=tasks, samples_per_task=2, rounds=3, max_in_flight=100, schedule=schedule
        )
        batch = _batch(spec)
        _record(spec, batch, decide(spec, batch, cancelled=False).start)
        # quick's and solved's samples end; slow's two still run.
        _end(
            batch,
            {("quick", 0): True, ("quick", 1): False, ("solved", 0): True, ("solved", 1): True},
        )
        plan = decide(spec, batch, cancelled=False)
        assert _started(spec, plan.start) == expected, schedule
        saturated = {s.task_id for s in batch.skips if s.reason == "saturated"}
        assert saturated == ({"solved"} if schedule == "per_task" else set()), schedule
        assert batch.status == "in_progress"
    # per_task: quick's round 2 ends while slow still runs: quick's round 3 starts at once.
    spec = _spec(tasks=tasks, samples_per_task=2, rounds=3, max_in_flight=100)
    batch = _batch(spec)
    _record(spec, batch, decide(spec, batch, cancelled=False).start)
    _end(batch, {("quick", 0): True, ("quick", 1): False, ("solved", 0): True, ("solved", 1): True})
    _record(spec, batch, decide(spec, batch, cancelled=False).start)
    _end(batch, {("quick", 2): True, ("quick", 3): False})
    plan = decide(spec, batch, cancelled=False)
    assert _started(spec, plan.start) == [("quick", 4, 3), ("quick", 5, 3)]
    assert batch.round == 3
    # quick's last round ends: nothing more for it; the batch waits for slow alone.
    _record(spec, batch, plan.start)
    _end(batch, {("quick", 4): True, ("quick", 5): True})
    assert decide(spec, batch, cancelled=False).start == []
    assert batch.status == "in_progress"
    # slow's round 1 ends, all failed: saturated on its own; then the batch is complete.
    _end(batch, {("slow", 0): False, ("slow", 1): False})
    plan = decide(spec, batch, cancelled=False)
    assert plan.start == [] and batch.status == "completed"
    details = {s.task_id: s.detail for s in batch.skips if s.reason == "saturated"}
    assert details == {
        "solved": "after round 1: all 2 samples passed",
        "slow": "after round 1: all 2 samples failed",
    }


def test_domains_share_the_window_by_weight() -> None:
    tasks = [_task("slow", f"s{i}") for i in range(10)] + [
        _task("fast", f"f{i}") for i in range(10)
    ]
    spec = _spec(
        tasks=tasks, samples_per_task=1, max_in_flight=4, domain_weights={"slow": 1, "fast": 3}
    )
    plan = decide(spec, _batch(spec), cancelled=False)
    domains = [spec.tasks[s.task].domain for s in plan.start]
    assert sorted(domains) == ["fast", "fast", "fast", "slow"]


def test_budget_cancel_and_a_failing_domain() -> None:
    spec = _spec(samples_per_task=4, budget={"max_jobs": 5}, max_in_flight=100)
    batch = _batch(spec)
    assert len(decide(spec, batch, cancelled=False).start) == 5
    spec = _spec(samples_per_task=2, max_in_flight=100)
    batch = _batch(spec)
    for s in decide(spec, batch, cancelled=False).start:
        t = spec.tasks[s.task]
        batch.rollouts.append(
            Rollout(
                job_id=f"j{s.task}{s.sample}",
                domain=t.domain,
                task_id=t.task_id,
                sample=s.sample,
                round=1,
            )
        )
    for r in batch.rollouts:
        if r.domain == "code":
            r.status, r.error_code = "failed", "environment_unavailable"
    plan = decide(spec, batch, cancelled=False)
    assert "code" in batch.removed_domains and plan.start == []
    assert plan.cancel == []  # code's rollouts all ended; docs' go on
    plan = decide(spec, batch, cancelled=True)
    assert batch.status == "cancelled" and sorted(plan.cancel) == ["j20", "j21"]


def test_the_conversation_is_what_the_agent_sent() -> None:
    entries = [
        {"type": "setup", "command": "true", "exit_code": 0, "output": ""},
        {"type": "model", "content": "```bash\nls\n```", "tool_calls": None},
        {"type": "command", "step": 1, "command": "ls", "exit_code": 0, "output": "a\n"},
        {"type": "model", "content": "hmm", "tool_calls": None},
        {"type": "model", "content": "DONE", "tool_calls": None},
    ]
    messages = conversation("list", entries)
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    assert messages[3]["content"] == "exit status 0\na\n"
    assert messages[5]["content"].startswith("No command found.")
    assert messages[-1]["content"] == "DONE"


def _scored(batch: Batch, domain: str, passes: list[bool], start: int = 0) -> None:
    for i, passed in enumerate(passes):
        batch.rollouts.append(
            Rollout(
                job_id=f"{domain}-{start + i}",
                domain=domain,
                task_id=f"t{start + i}",
                sample=0,
                round=1,
                status="completed",
                passed=passed,
                reward=1.0 if passed else 0.0,
            )
        )


def test_adaptive_weights_move_toward_the_target_band_and_never_starve_a_domain() -> None:
    """Issue 51: domain weights were fixed at submit. With ``adaptive``, a domain inside the
    pass-rate band gains weight, a solved or hopeless one loses it, within the bounds, and
    every change is recorded with its reason."""
    tasks = [_task(d, f"x{i}") for d in ("easy", "mid", "hard") for i in range(40)]
    adaptive = {"every": 4, "step": 2, "min_factor": 0.25, "max_factor": 4}
    spec = _spec(tasks=tasks, samples_per_task=1, max_in_flight=12, adaptive=adaptive)
    batch = _batch(spec)
    for n in range(3):  # three weighings of four scored rollouts each
        _scored(batch, "easy", [True] * 4, start=4 * n)
        _scored(batch, "mid", [True, False] * 2, start=4 * n)
        _scored(batch, "hard", [False] * 4, start=4 * n)
        decide(spec, batch, cancelled=False)
    assert batch.weight_factors == {"easy": 0.25, "mid": 4.0, "hard": 0.25}
    changes = [(c.domain, c.previous, c.factor) for c in batch.weight_changes]
    assert changes == [
        ("easy", 1.0, 0.5),
        ("hard", 1.0, 0.5),
        ("mid", 1.0, 2.0),
        ("easy", 0.5, 0.25),
        ("hard", 0.5, 0.25),
        ("mid", 2.0, 4.0),
    ]  # the third weighing: every domain at its bound, nothing changes
    reasons = {c.domain: c.reason for c in batch.weight_changes}
    assert "pass rate 100% outside the target [20%, 80%] (solved)" in reasons["easy"]
    assert "(hopeless)" in reasons["hard"] and "inside the target" in reasons["mid"]
    # The next samples: mid holds most of the window, the others one slot each, not none.
    shares = Counter(spec.tasks[s.task].domain for s in decide(spec, batch, False).start)
    assert shares["mid"] > shares["easy"] >= 1 and shares["hard"] >= 1, shares
    # A domain back inside the band gains again.
    _scored(batch, "easy", [True, False, True, False], start=12)
    decide(spec, batch, cancelled=False)
    assert batch.weight_factors["easy"] == 0.5


def test_extra_samples_go_first_to_the_tasks_whose_rewards_vary_most() -> None:
    tasks = [_task("code", "flat"), _task("code", "split")]
    for adaptive in ({"every": 1000}, None):
        spec = _spec(tasks=tasks, samples_per_task=2, rounds=2, max_in_flight=2, adaptive=adaptive)
        batch = _batch(spec)
        _record(spec, batch, decide(spec, batch, cancelled=False).start)  # flat's two
        _end(batch, {("flat", 0): True, ("flat", 1): False})
        for r in batch.rollouts:  # rewards 0.6 and 0.4: mixed, variance 0.01
            r.reward = 0.6 if r.passed else 0.4
        plan = decide(spec, batch, cancelled=False)
        if adaptive is None:  # the planned order, task by task: flat's extra samples
            assert _started(spec, plan.start) == [("flat", 2, 2), ("flat", 3, 2)]
            continue
        assert _started(spec, plan.start) == [("split", 0, 1), ("split", 1, 1)]  # round 1 first
        _record(spec, batch, plan.start)
        _end(batch, {("split", 0): True, ("split", 1): False})  # rewards 1 and 0: variance 0.25
        plan = decide(spec, batch, cancelled=False)
        assert _started(spec, plan.start) == [("split", 2, 2), ("split", 3, 2)]
        allocations = {(a.task_id, a.round): a.reason for a in batch.allocations}
        assert allocations == {
            ("flat", 2): "1 of 2 scored samples passed (reward variance 0.010)",
            ("split", 2): "1 of 2 scored samples passed (reward variance 0.250)",
        }


def test_a_rollout_far_over_its_domains_median_is_cut_once_and_never_scored() -> None:
    """Issue 51: a straggler held its slot as long as it ran. With ``tail_cut`` a rollout
    over that many times its domain's median is cancelled, and the skip says why."""
    spec = _spec(tasks=[_task("code", f"t{i}") for i in range(7)], samples_per_task=1, tail_cut=3)
    batch = _batch(spec)
    for i in range(5):  # five scored rollouts of 2 s: the median
        batch.rollouts.append(
            Rollout(
                job_id=f"done-{i}",
                domain="code",
                task_id=f"t{i}",
                sample=0,
                round=1,
                status="completed",
                passed=True,
                reward=1.0,
                started_at=100,
                ended_at=102,
            )
        )
    for name, started in (("slow", 100), ("fine", 104)):
        batch.rollouts.append(
            Rollout(
                job_id=name,
                domain="code",
                task_id="t5" if name == "slow" else "t6",
                sample=0,
                round=1,
                status="running",
                started_at=started,
            )
        )
    plan = decide(spec, batch, cancelled=False, now=108.0)  # slow held 8 s > 3 x 2 s
    assert plan.cancel == ["slow"] and batch.cut == ["slow"]
    skip = next(s for s in batch.skips if s.reason == "tail_cut")
    assert skip.task_id == "t5"
    assert (
        skip.detail
        == "sample 0 (round 1) held its slot 8 s, over 3x its domain's median rollout (2 s)"
    )
    assert decide(spec, batch, cancelled=False, now=109.0).cancel == []  # once
    # Without tail_cut nothing is cut, whatever the time.
    plain = _spec(tasks=[_task("code", f"t{i}") for i in range(7)], samples_per_task=1)
    other = _batch(plain)
    other.rollouts = [r.model_copy() for r in batch.rollouts]
    assert decide(plain, other, cancelled=False, now=1000.0).cancel == []


def test_samples_too_many_policy_versions_behind_run_again_under_the_current_one() -> None:
    """Issue 51: a trainer that updates the policy mid-batch could not bound how stale its
    data is. With ``max_staleness`` a queued sample more versions behind is withdrawn
    (cancelled, kept in ``stale``) and started again; a running one goes on unless
    ``cancel_stale_running``."""
    spec = _spec(samples_per_task=2, max_in_flight=100, max_staleness=1)
    batch = _batch(spec)
    _record(spec, batch, decide(spec, batch, cancelled=False).start)
    for r in batch.rollouts:
        r.policy_version = 0
    batch.rollouts[0].status = "running"  # a's sample 0 runs; the rest are queued
    batch.policy_version = 2  # a trainer announced version 2
    plan = decide(spec, batch, cancelled=False)
    withdrawn = {r.job_id for r in batch.stale}
    assert set(plan.cancel) == withdrawn and len(withdrawn) == 5
    assert batch.rollouts[0].status == "running" and len(batch.rollouts) == 1
    assert sorted(_started(spec, plan.start)) == sorted(
        [("a", 1, 1), ("b", 0, 1), ("b", 1, 1), ("c", 0, 1), ("c", 1, 1)]
    )
    detail = next(s.detail for s in batch.skips if s.reason == "stale")
    assert "of policy version 0, more than 1 behind 2: it runs again" in detail
    assert job_id_of("b", 1, 0, again=1) != job_id_of("b", 1, 0)
    # cancel_stale_running: the running one too.
    spec = _spec(samples_per_task=2, max_in_flight=100, max_staleness=1, cancel_stale_running=True)
    batch = _batch(spec)
    _record(spec, batch, decide(spec, batch, cancelled=False).start)
    for r in batch.rollouts:
        r.policy_version, r.status = 0, "running"
    batch.policy_version = 1  # one behind: within max_staleness, nothing withdrawn
    assert decide(spec, batch, cancelled=False).cancel == []
    batch.policy_version = 2
    assert len(decide(spec, batch, cancelled=False).cancel) == 6


def test_an_overprovisioned_round_cancels_its_stragglers_once_the_group_is_scored() -> None:
    """Issue 51: over-provision and cut the tail. A round starts one sample more than its
    group needs; once two are scored the third is cancelled (never scored), the task
    goes on to its next round, and a sample not yet started is not started."""
    spec = _spec(
        tasks=[_task("code", "a"), _task("code", "b")],
        samples_per_task=2,
        rounds=2,
        overprovision=1,
        max_in_flight=5,
    )
    batch = _batch(spec)
    plan = decide(spec, batch, cancelled=False)
    assert _started(spec, plan.start) == [
        ("a", 0, 1),
        ("a", 1, 1),
        ("a", 2, 1),
        ("b", 0, 1),
        ("b", 1, 1),
    ]
    _record(spec, batch, plan.start)
    for r in batch.rollouts:
        r.status = "running"
    _end(batch, {("a", 0): True, ("a", 1): False, ("b", 0): True, ("b", 1): True})
    plan = decide(spec, batch, cancelled=False)
    straggler = job_id_of("b", 0, 2)
    assert plan.cancel == [straggler] and batch.surplus == [straggler]
    assert plan.start == []  # b's third sample is not needed: not started
    next(r for r in batch.rollouts if r.job_id == straggler).status = "cancelled"
    plan = decide(spec, batch, cancelled=False)
    # a (mixed) goes on to round 2 with its group and one more; b (all passed) saturated.
    assert _started(spec, plan.start) == [("a", 3, 2), ("a", 4, 2), ("a", 5, 2)]
    assert {s.task_id for s in batch.skips if s.reason == "saturated"} == {"b"}
    assert spec.most_rollouts() == 2 * (3 + 3)
