"""Circuit breakers per environment (tiergate.jobs.state.breaker): the state machine on a real
S3 server (SeaweedFS) with concurrent writers, and end to end through the gateway, Kafka
(Tansu) and workers: it opens after the configured failures, fails new jobs fast, lets one
probe through after the cool-down and closes when the probe works."""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.jobs.envs import cache_dir
from tests.jobs.tenants import tenants
from tests.jobstack import JobsStack, jobs_stack
from tests.waiting import eventually
from tiergate.envs.build import Built
from tiergate.envs.registry import Registry
from tiergate.jobs.run.observe import WorkerMetrics
from tiergate.jobs.state.breaker import Breaker, BreakerBoard, command
from tiergate.jobs.state.store import JobStore
from tiergate.jobsettings import JobsSettings
from tiergate.objectstore import ObjectStore
from tiergate.protocol import JobCreate

BROKEN = {
    "model": MODEL,
    "instruction": "Say DONE.",
    "setup": ["exit 3"],
    "limits": {"max_steps": 2, "timeout_seconds": 60},
}
WORKS = {**BROKEN, "setup": ["true"]}
ENDED = ("completed", "failed", "cancelled", "incomplete")
# The stack test's cool-down: longer than the test, so that nothing depends on how fast the
# machine is; the test ends it by hand (:func:`_cooled_down`), as the unit tests move
# their clock.
COOLDOWN = 3600


def _settings(s3: str, **breaker: Any) -> JobsSettings:
    return JobsSettings.model_validate(
        {
            "storage": {"endpoint_url": s3, "bucket": f"bucket-{uuid.uuid4().hex[:10]}"},
            "breaker": {"failures_to_open": 2, "cooldown_seconds": 60, **breaker},
        }
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _board(settings: JobsSettings, clock: Clock, name: str = "w1") -> BreakerBoard:
    store = JobStore(settings.storage)  # a client of its own, as another worker has
    return BreakerBoard(store, settings, WorkerMetrics(), identity=name, clock=clock)


def test_environment_name_is_validated_and_defaults() -> None:
    assert JobCreate(model="m", instruction="x").environment == "default"
    assert JobCreate(model="m", instruction="x", environment="py3.12-slim").environment
    for bad in ("", "Upper", "-lead", "a/b", "x" * 64):
        with pytest.raises(ValueError):
            JobCreate(model="m", instruction="x", environment=bad)


def test_a_long_probe_holds_the_half_open_state_for_probe_seconds_at_most(s3: str) -> None:
    """Issue 33: a tenant's one-hour probe job held the environment half-open for the hour,
    failing every other tenant's job there, and the refusal named the probe's job id."""
    settings = _settings(s3, probe_seconds=120)
    JobStore(settings.storage).ensure_bucket()
    clock = Clock()
    board = _board(settings, clock)
    for job in ("job_a", "job_b"):
        board.record("env1", job, "setup", "exit 3", owner=job)
    clock.now += 61
    assert board.admit("env1", "job_mallory_probe").probe
    clock.now += 100
    refused = board.admit("env1", "job_other")
    assert not refused.allowed and "job_mallory_probe" not in refused.message, refused.message
    assert "the probe job now running" in refused.message
    clock.now += 21  # the probe has run past probe_seconds without a verdict
    taken = board.admit("env1", "job_other")
    assert taken.allowed and taken.probe and taken.breaker.probe == "job_other"


def test_state_machine_on_real_s3(s3: str) -> None:
    settings = _settings(s3)
    JobStore(settings.storage).ensure_bucket()
    clock = Clock()
    a, b = _board(settings, clock, "w1"), _board(settings, clock, "w2")
    assert a.admit("env1", "job_1").allowed  # no record: closed
    a.record("env1", "job_1", "setup", "exit 3", owner="alice")
    assert a.read("env1")[0].state == "closed" and a.read("env1")[0].failures == 1
    a.record("env1", "job_x", "ok")  # the environment worked: the count starts again
    assert b.read("env1")[0].failures == 0
    a.record("env1", "job_2", "neutral")  # a timeout, a cancellation: not counted
    a.record("env1", "job_2", "setup", "exit 3", owner="alice")
    b.record("env1", "job_3", "sandbox_start", "no bwrap")  # another worker's failure
    opened = a.read("env1")[0]
    assert (opened.state, opened.failures, opened.changed_by) == ("open", 2, "w2")
    refused = b.admit("env1", "job_4")
    assert not refused.allowed and "'env1'" in refused.message and "open" in refused.message
    assert a.admit("env2", "job_5").allowed  # another environment is unaffected
    clock.now += 61
    probe = a.admit("env1", "job_6")
    assert probe.allowed and probe.probe and probe.breaker.state == "half_open"
    assert not b.admit("env1", "job_7").allowed  # exactly one probe
    assert b.admit("env1", "job_6").allowed  # the probe, redelivered
    a.record("env1", "job_6", "verifier", "exit 139", owner="bob")  # the probe failed: open
    # again (bob's commands had not failed in this run of failures; alice's had)
    again = b.read("env1")[0]
    assert again.state == "open" and again.opened_at == clock.now
    clock.now += 61
    assert b.admit("env1", "job_8").probe
    b.record("env1", "job_8", "neutral")  # no verdict: the probe is handed back
    assert a.read("env1")[0].state == "open"
    assert a.admit("env1", "job_9").probe
    a.record("env1", "job_9", "ok")
    closed = b.read("env1")[0]
    assert (closed.state, closed.failures, closed.probe) == ("closed", 0, None)
    metrics = a._metrics
    assert metrics is not None
    sample = metrics.registry.get_sample_value
    assert sample("tiergate_environment_breaker_state", {"environment": "env1"}) == 0
    assert (
        sample(
            "tiergate_environment_breaker_transitions_total", {"environment": "env1", "to": "open"}
        )
        == 1
    )  # w2 opened it the first time, w1 the second
    assert (
        sample(
            "tiergate_environment_infra_failures_total", {"environment": "env1", "stage": "setup"}
        )
        == 2
    )
    # The operator holds it open: no probe after the cool-down until it is closed.
    command(settings, "open", "env1")
    clock.now += 1000
    held = a.admit("env1", "job_10")
    assert not held.allowed and "operator" in held.message
    command(settings, "close", "env1")
    assert a.admit("env1", "job_11").allowed
    listed = {row["environment"]: row for row in command(settings, "list")}
    assert listed["env1"]["state"] == "closed" and listed["env1"]["changed_by"].startswith(
        "operator"
    )


def test_one_owner_cannot_open_a_shared_breaker(s3: str) -> None:
    """The attacker's test: a tenant whose own setup and verifier fail on purpose counts
    once, however often; several owners failing open the breaker; the refusal another
    tenant gets names no other tenant's command."""
    settings = _settings(s3, failures_to_open=3)
    JobStore(settings.storage).ensure_bucket()
    clock = Clock()
    board = _board(settings, clock)
    for i in range(10):
        stage = "setup" if i % 2 else "verifier"
        board.record("env1", f"job_m{i}", stage, "exit 3: cat /secret-of-mallory", owner="mallory")
    assert board.admit("env1", "job_alice").allowed
    assert board.read("env1")[0].failures == 1
    board.record("env1", "job_b", "setup", "exit 1: make", owner="bob")
    assert board.read("env1")[0].state == "closed"
    board.record("env1", "job_c", "setup", "exit 1: make", owner="carol")
    opened = board.read("env1")[0]
    assert (opened.state, opened.failures) == ("open", 3)
    assert sorted(opened.owners) == ["bob", "carol", "mallory"]
    refused = board.admit("env1", "job_alice2")
    assert (
        not refused.allowed and "mallory" not in refused.message and "make" not in refused.message
    )
    # A probe whose owner's commands already counted hands the probe back: mallory cannot
    # keep the breaker open by racing to be the probe.
    clock.now += 61
    assert board.admit("env1", "job_m_probe").probe
    board.record("env1", "job_m_probe", "setup", "exit 3", owner="mallory")
    handed = board.read("env1")[0]
    assert handed.state == "open" and handed.opened_at == opened.opened_at
    assert board.admit("env1", "job_d").probe
    board.record("env1", "job_d", "ok", owner="dave")
    closed = board.read("env1")[0]
    assert (closed.state, closed.failures, closed.owners) == ("closed", 0, [])
    # Sandbox start failures are the environment's: each counts, whoever's job it was.
    for i in range(3):
        board.record("env1", f"job_s{i}", "sandbox_start", "unpack failed", owner="mallory")
    assert board.read("env1")[0].state == "open"


def _together(count: int, work: Callable[[int], Any]) -> list[Any]:
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            barrier.wait(10)
            results[index] = work(index)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return results


def test_concurrent_writers_lose_no_update_and_one_probe_wins(s3: str) -> None:
    settings = _settings(s3, failures_to_open=100)
    JobStore(settings.storage).ensure_bucket()
    clock = Clock()
    boards = [_board(settings, clock, f"w{i}") for i in range(6)]
    _together(6, lambda i: boards[i].record("env", f"job_{i}", "setup", "exit 3", owner=f"o{i}"))
    assert boards[0].read("env")[0].failures == 6  # every increment landed
    forced = BreakerBoard(JobStore(settings.storage), settings, clock=clock)
    forced._settings = settings.breaker.model_copy(update={"failures_to_open": 7})
    forced.record("env", "job_x", "setup", "exit 3", owner="o6")
    assert forced.read("env")[0].state == "open"
    clock.now += 61
    admitted = _together(6, lambda i: boards[i].admit("env", f"probe_{i}"))
    assert sum(a.allowed for a in admitted) == 1  # exactly one probe through
    winner: Breaker = boards[0].read("env")[0]
    assert winner.state == "half_open" and winner.probe is not None


def _wait_for(what: Callable[[], Any], timeout: float = 60) -> Any:
    return eventually(what, timeout, 0.2)


def _cooled_down(board: BreakerBoard, environment: str) -> float:
    """Move the open breaker's opening back past the cool-down (what waiting it out does,
    without the wait); the new opening time."""
    breaker, etag = board.read(environment)
    assert breaker.state == "open" and breaker.opened_at is not None, breaker
    breaker.opened_at -= COOLDOWN + 1
    assert board._write(breaker, etag), "the breaker changed meanwhile"
    return breaker.opened_at


def _run(stack: JobsStack, body: dict[str, Any], key: dict[str, str]) -> dict[str, Any]:
    job = stack.submit(body, headers=key)
    return stack.wait(job["id"], lambda j: j["status"] in ENDED, timeout=90, headers=key)


def test_breaker_opens_fails_fast_and_closes_after_a_probe(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path, built_env: Built
) -> None:
    model.behaviour.replies = ["DONE"]
    jobs = {
        "breaker": {"failures_to_open": 2, "cooldown_seconds": COOLDOWN},
        "sandbox": {"cache_dir": cache_dir()},
    }
    # Each owner's failing setup counts once: the failures come from several tenants.
    keys = tenants("alice", "bob", "carol", "dave")
    alice, bob, carol, dave = (keys.headers(n) for n in ("alice", "bob", "carol", "dave"))
    with jobs_stack(
        broker, s3, model, tmp_path, jobs=jobs, auth=keys.auth, worker={"api_key": keys.worker}
    ) as stack:
        # Names that are not registered fail (environment_not_found): both are the test
        # environment (tests/jobs/envs.py) under two names, two breakers.
        registry = Registry(ObjectStore(stack.jobs.storage))
        for name in ("flaky", "other"):
            renamed = built_env.manifest.model_copy(update={"name": name})
            registry.register(dataclasses.replace(built_env, manifest=renamed))
        first, second = stack.start_worker(), stack.start_worker()  # share the breaker
        board = BreakerBoard(JobStore(stack.jobs.storage), stack.jobs)
        flaky = {**BROKEN, "environment": "flaky"}
        for owner in (alice, bob):
            done = _run(stack, flaky, owner)
            assert done["status"] == "failed" and done["error"]["code"] == "sandbox"
            assert done["environment"] == "flaky"
        # The breaker hears a job's verdict just after its terminal record is written.
        _wait_for(lambda: board.read("flaky")[0].state == "open")

        fast = _run(stack, {**WORKS, "environment": "flaky"}, dave)
        assert fast["status"] == "failed", fast
        assert fast["error"]["code"] == "environment_unavailable"
        message = fast["error"]["message"]
        assert "'flaky'" in message and "open" in message and "next probe" in message
        assert fast["started_at"] is None and fast["steps"] == 0
        assert "trajectory" not in fast["artifacts"]  # no sandbox, no setup ran

        other = _run(stack, {**WORKS, "environment": "other"}, dave)
        assert other["status"] == "completed", other

        # After the cool-down a probe runs; it fails, so the breaker opens again.
        opened_at = _cooled_down(board, "flaky")
        probe = _run(stack, flaky, carol)
        assert probe["error"]["code"] == "sandbox", probe  # it ran: setup failed
        reopened = _wait_for(
            lambda: (
                (b := board.read("flaky")[0]).state == "open"
                and (b.opened_at or 0) > opened_at
                and b
            )
        )

        # The next probe works: closed, and jobs run again.
        assert reopened
        _cooled_down(board, "flaky")
        good = _run(stack, {**WORKS, "environment": "flaky"}, dave)
        assert good["status"] == "completed", good
        closed = _wait_for(lambda: (b := board.read("flaky")[0]).state == "closed" and b)
        assert closed.failures == 0
        assert _run(stack, {**WORKS, "environment": "flaky"}, dave)["status"] == "completed"

        # The operator holds it open, then closes it.
        command(stack.jobs, "open", "flaky")
        held = _run(stack, {**WORKS, "environment": "flaky"}, dave)
        assert held["error"]["code"] == "environment_unavailable"
        assert "operator" in held["error"]["message"]
        command(stack.jobs, "close", "flaky")
        assert _run(stack, {**WORKS, "environment": "flaky"}, dave)["status"] == "completed"

        # Metrics: the workers together made the transitions; each gauge follows the store.
        def total(name: str, labels: dict[str, str]) -> float:
            return sum(
                w.metrics.registry.get_sample_value(name, labels) or 0.0 for w in (first, second)
            )

        transitions = "tiergate_environment_breaker_transitions_total"
        assert total(transitions, {"environment": "flaky", "to": "open"}) == 2
        assert total(transitions, {"environment": "flaky", "to": "half_open"}) == 2
        assert total(transitions, {"environment": "flaky", "to": "closed"}) == 1
        assert (
            total(
                "tiergate_environment_infra_failures_total",
                {"environment": "flaky", "stage": "setup"},
            )
            == 3
        )
        assert total("tiergate_environment_jobs_failed_fast_total", {"environment": "flaky"}) == 2
        assert (
            total(
                "tiergate_jobs_finished_total",
                {"status": "failed", "reason": "environment_unavailable"},
            )
            == 2
        )
        for w in (first, second):
            w.breakers.refresh()
            state = w.metrics.registry.get_sample_value(
                "tiergate_environment_breaker_state", {"environment": "flaky"}
            )
            assert state == 0.0
        text = httpx.get(f"{stack.base}/v1/jobs", headers=dave).json()
        assert all("environment" in j for j in text["data"])
