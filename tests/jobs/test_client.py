"""The jobs client (tiergate.jobsclient) and ``tiergate jobs`` against the real job stack:
gateway -> Kafka (Tansu) -> worker -> bubblewrap -> S3 (SeaweedFS), FakeVllm as the model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.jobs.cutproxy import FakeCuttingProxy
from tests.jobstack import JobsStack, jobs_stack
from tests.readme_blocks import run_readme_block
from tests.servers import free_port
from tests.waiting import eventually
from tiergate.enginesettings import DEFAULT_MODEL_NAME
from tiergate.jobsclient import (
    AsyncJobsClient,
    Job,
    JobCreate,
    JobEvent,
    JobsAPIError,
    JobsClient,
    JobsConnectionError,
    JobsStreamError,
    JobsTimeout,
)
from tiergate.jobsclient.base import Follow, Reconnect, options

TIERGATE = Path(sys.executable).with_name("tiergate")
SOLVE = "```bash\necho $(( 6 * 7 )) > answer.txt\n```"
STEPS = ["```bash\necho one\n```", "```bash\necho two\n```", SOLVE, "DONE"]
TASK: dict[str, Any] = {
    "model": MODEL,
    "instruction": "Write six times seven into answer.txt.",
    "workspace": {"files": {"README.md": "the task\n"}},
    "verifier": {
        "command": 'test "$(cat answer.txt)" = 42 && echo 1 > reward.txt',
        "reward_file": "reward.txt",
    },
    "limits": {"max_steps": 6, "timeout_seconds": 60},
}


@pytest.fixture
def stack(broker: str, s3: str, model: FakeVllm, tmp_path: Path) -> Iterator[JobsStack]:
    with jobs_stack(broker, s3, model, tmp_path) as running:
        yield running


def _sequence(events: list[JobEvent]) -> list[int]:
    return [e.sequence_number for e in events]


def _finished(client: JobsClient, model: FakeVllm, replies: list[str]) -> str:
    """Run TASK to its end; its id."""
    model.behaviour.replies = list(replies)
    job = client.submit(TASK)
    assert client.wait(job.id, timeout=60).status == "completed"
    return job.id


def test_submit_then_wait_returns_the_completed_job_with_its_events(
    stack: JobsStack, model: FakeVllm
) -> None:
    model.behaviour.replies = list(STEPS)
    stack.start_worker()
    with JobsClient(stack.base) as client:
        job = client.submit(TASK)
        assert job.status == "queued" and job.id.startswith("job_") and job.artifacts == {}
        seen: list[JobEvent] = []
        final = client.wait(job.id, timeout=60, on_event=seen.append)
        assert final.status == "completed" and final.passed, final
        assert final.result is not None and final.result.reward == 1.0
        assert final.steps == 3 and final.terminal
        assert set(final.artifacts) == {"trajectory", "workspace", "verifier_log", "result"}
        assert _sequence(seen) == list(range(1, len(seen) + 1))
        assert seen[0].type == "job.queued" and seen[-1].type == "job.completed"
        steps = [e for e in seen if e.type == "job.step"]
        assert [(e.step, e.command, e.exit_code, e.run) for e in steps] == [
            (1, "echo one", 0, 1),
            (2, "echo two", 0, 1),
            (3, "echo $(( 6 * 7 )) > answer.txt", 0, 1),
        ]  # the run (lease epoch) that wrote each: the first
        assert seen[-1].job is not None and seen[-1].job.status == "completed"
        # The events again, from a sequence number on; a finished job's stream ends.
        later = list(client.events(job.id, starting_after=3))
        assert _sequence(later) == list(range(4, len(seen) + 1))
        assert _stable(client.get(job.id)) == _stable(final)
        assert client.cancel(job.id).status == "completed"  # a finished job stays finished

        page = client.list(limit=1)
        assert [j.id for j in page.data] == [job.id] and page.has_more is False
        assert [j.id for j in client.iter_jobs(page_size=1)] == [job.id]


def test_events_resume_after_dropped_connections_without_loss_or_repeats(
    stack: JobsStack, model: FakeVllm
) -> None:
    stack.start_worker()
    with JobsClient(stack.base) as client:
        job_id = _finished(client, model, STEPS)
        path = f"/v1/jobs/{job_id}/events"
        with FakeCuttingProxy(stack.base) as proxy:
            whole = httpx.get(proxy.url + path, timeout=30).text
            expected = [json.loads(p[6:]) for p in whole.split("\n\n") if p.startswith("data: {")]
            assert len(expected) >= 7
            eventually(lambda: proxy.body_bytes, 10, 0.05, "the proxy counted the body")
            total = proxy.body_bytes[0]
            # Two cuts, each (most likely) in the middle of an event.
            proxy.cuts = [total // 3, total // 3]
            proxy.requests.clear()
            with JobsClient(proxy.url, backoff_seconds=0.05) as flaky:
                events = list(flaky.events(job_id))
        assert proxy.cut == 2
        assert [e.model_dump(exclude_unset=True) for e in events] == expected
        resumed = [int(r.split("starting_after=")[1].split()[0]) for r in proxy.requests]
        assert resumed[0] == 0 and resumed == sorted(resumed) and len(resumed) == 3
        assert resumed[-1] > 0

        # A stream that never gets anywhere: the client gives up, saying where to resume.
        with FakeCuttingProxy(stack.base, cuts=[0] * 10) as proxy:
            flaky = JobsClient(proxy.url, max_stream_retries=2, backoff_seconds=0.01)
            with pytest.raises(JobsStreamError, match="starting_after=0"):
                list(flaky.events(job_id))
            assert proxy.cut == 3


def test_wait_follows_a_running_job_across_dropped_connections(
    stack: JobsStack, model: FakeVllm
) -> None:
    model.behaviour.replies = list(STEPS)
    stack.start_worker()
    job = JobsClient(stack.base).submit(TASK)
    # The first three connections (the event stream's) break after 150 bytes of events.
    with (
        FakeCuttingProxy(stack.base, cuts=[150, 150, 150]) as proxy,
        JobsClient(proxy.url, backoff_seconds=0.05) as client,
    ):
        seen: list[JobEvent] = []
        final = client.wait(job.id, timeout=60, on_event=seen.append)
    assert final.status == "completed" and final.passed
    assert proxy.cut >= 2
    assert _sequence(seen) == list(range(1, len(seen) + 1))
    assert seen[-1].type == "job.completed"
    direct = list(JobsClient(stack.base).events(job.id))
    assert _sequence(seen) == _sequence(direct)


def test_errors_come_from_the_envelope_and_wait_times_out(stack: JobsStack) -> None:
    with JobsClient(stack.base) as client:
        with pytest.raises(JobsAPIError) as missing:
            client.get("job_nope")
        assert (missing.value.status, missing.value.code) == (404, "job_not_found")
        assert missing.value.param == "job_id" and "job_nope" in missing.value.message
        with pytest.raises(JobsAPIError) as bad:
            client.submit({**TASK, "limits": {"max_steps": 0}})
        assert bad.value.status == 400 and bad.value.param == "limits.max_steps"
        with pytest.raises(JobsAPIError) as unknown:
            client.submit({**TASK, "model": "nope"})
        assert unknown.value.code == "model_not_found"
        # A stream's 404 is an answer, not a dropped connection: no retrying.
        started = time.monotonic()
        with pytest.raises(JobsAPIError) as no_events:
            list(client.events("job_nope"))
        assert no_events.value.code == "job_not_found" and time.monotonic() - started < 5

        # No worker runs: the job stays queued, and wait gives up on time.
        job = client.submit(TASK)
        started = time.monotonic()
        with pytest.raises(JobsTimeout, match="queued") as late:
            client.wait(job.id, timeout=1.5)
        assert 1.4 < time.monotonic() - started < 10 and late.value.status == "queued"
        assert client.cancel(job.id).status == "cancelled"

    with (
        JobsClient(f"http://127.0.0.1:{free_port()}") as nobody,
        pytest.raises(JobsConnectionError),
    ):
        nobody.get("job_x")


def test_an_idempotency_key_returns_the_same_job(stack: JobsStack) -> None:
    with JobsClient(stack.base + "/v1") as client:  # an OpenAI-style base URL works too
        spec = JobCreate.model_validate(TASK)
        first = client.submit(spec, idempotency_key="retry-1")
        again = client.submit(spec, idempotency_key="retry-1")
        as_dict = client.submit(TASK, idempotency_key="retry-1")
        other = client.submit(spec, idempotency_key="retry-2")
        assert first.id == again.id == as_dict.id != other.id
        assert [j.id for j in client.iter_jobs()] == [other.id, first.id]


def _cli(*args: str, base: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TIERGATE_BASE_URL": base}
    return subprocess.run(
        [str(TIERGATE), "jobs", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_the_cli_shows_progress_and_prints_the_job(
    stack: JobsStack, model: FakeVllm, tmp_path: Path
) -> None:
    stack.start_worker()
    workspace = tmp_path / "project"
    (workspace / "src").mkdir(parents=True)
    (workspace / "src" / "given.txt").write_text("from the upload\n")
    upload = _cli("upload", str(workspace), base=stack.base)
    assert upload.returncode == 0, upload.stderr
    upload_id = upload.stdout.strip()
    assert upload_id.startswith("upl_")

    task = {
        **TASK,
        "workspace": {"upload_id": upload_id},
        "verifier": {"command": "grep -q upload src/given.txt && test $(cat answer.txt) = 42"},
    }
    model.behaviour.replies = [SOLVE, "DONE"]
    done = _cli("submit", "--wait", "-", base=stack.base, stdin=json.dumps(task))
    assert done.returncode == 0, done.stderr
    job = json.loads(done.stdout)
    assert job["status"] == "completed" and job["result"]["passed"] is True
    progress = done.stderr.splitlines()
    assert progress[0] == f"[{job['id']}] submitted"
    assert f"[{job['id']}] queued" in progress
    assert f"[{job['id']}] step 1: echo $(( 6 * 7 )) > answer.txt (exit 0)" in progress
    assert progress[-1] == f"[{job['id']}] completed: passed=true"

    # A job that ends without passing: exit status 1, and still the job on stdout.
    model.behaviour.replies = ["DONE"]
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps(TASK))
    failed = _cli("submit", str(spec), base=stack.base)
    assert failed.returncode == 0, failed.stderr
    failed_id = json.loads(failed.stdout)["id"]
    waited = _cli("wait", failed_id, "--timeout", "60", base=stack.base)
    assert waited.returncode == 1, waited.stderr
    assert json.loads(waited.stdout)["result"]["passed"] is False

    events = _cli("events", failed_id, "--starting-after", "1", base=stack.base)
    lines = [json.loads(line) for line in events.stdout.splitlines()]
    assert events.returncode == 0 and lines[0]["sequence_number"] == 2
    assert lines[-1]["type"] == "job.completed"
    listed = _cli("list", "--limit", "1", base=stack.base)
    assert json.loads(listed.stdout)["data"][0]["id"] == failed_id
    assert json.loads(_cli("get", job["id"], base=stack.base).stdout)["id"] == job["id"]
    assert json.loads(_cli("cancel", job["id"], base=stack.base).stdout)["status"] == "completed"

    # Client errors: exit status 2 and the gateway's error on stderr.
    missing = _cli("get", "job_nope", base=stack.base)
    assert missing.returncode == 2 and "job_not_found" in missing.stderr
    assert missing.stdout == ""
    bad = _cli("submit", "-", base=stack.base, stdin="[1]")
    assert bad.returncode == 2 and "JSON object" in bad.stderr


async def test_the_async_client_submits_waits_and_resumes(
    stack: JobsStack, model: FakeVllm
) -> None:
    model.behaviour.replies = list(STEPS)
    stack.start_worker()
    async with AsyncJobsClient(stack.base) as client:
        job = await client.submit(TASK, idempotency_key="async-1")
        assert (await client.submit(TASK, idempotency_key="async-1")).id == job.id
        seen: list[JobEvent] = []

        async def on_event(event: JobEvent) -> None:
            seen.append(event)

        final = await client.wait(job.id, timeout=60, on_event=on_event)
        assert final.status == "completed" and final.passed
        assert _sequence(seen) == list(range(1, len(seen) + 1))
        assert _stable(await client.get(job.id)) == _stable(final)
        assert [j.id async for j in client.iter_jobs()] == [job.id]
        with pytest.raises(JobsAPIError) as missing:
            await client.cancel("job_nope")
        assert missing.value.code == "job_not_found"

    with FakeCuttingProxy(stack.base, cuts=[200, 200]) as proxy:
        async with AsyncJobsClient(proxy.url, backoff_seconds=0.05) as flaky:
            resumed = [e async for e in flaky.events(job.id)]
    assert proxy.cut == 2
    assert _sequence(resumed) == _sequence(seen)


def test_the_readme_examples_run_with_a_fake_model(broker: str, s3: str, tmp_path: Path) -> None:
    """The README's examples as written (tests/e2e runs them on the real model)."""
    fake = FakeVllm(model=DEFAULT_MODEL_NAME).start()
    try:
        with jobs_stack(broker, s3, fake, tmp_path) as running:
            running.start_worker()
            for name in ("jobs-cli", "jobs-python"):
                fake.behaviour.replies = ["```bash\necho hello > hello.txt\n```", "DONE"]
                ran = run_readme_block(name, running.base, tmp_path, timeout=120)
                assert ran.returncode == 0, (name, ran.stdout, ran.stderr)
                if name == "jobs-cli":
                    job = json.loads(ran.stdout)
                    assert job["status"] == "completed" and job["result"]["passed"]
                    assert job["metadata"] == {"ticket": "ABC-1"}
                    assert "step 1: echo hello > hello.txt (exit 0)" in ran.stderr
                else:
                    lines = ran.stdout.splitlines()
                    assert lines[0].split() == ["job.queued"]
                    assert "job.step echo hello > hello.txt" in lines
                    assert lines[-1].startswith("completed passed=True reward=None")
    finally:
        fake.stop()


# -- the resume rules, without a server ------------------------------------------------------


def _follow(**overrides: Any) -> Follow:
    opts = options("http://gw", None, 5.0, 3, 0.5, 2.0)
    return Follow("job_x", overrides.get("after", 0), opts, overrides.get("deadline"))


def test_follow_skips_repeats_and_ends_after_the_terminal_event() -> None:
    follow = _follow(after=1)
    take = follow.take
    assert take(json.dumps({"type": "job.queued", "sequence_number": 1})) is None
    step = take(json.dumps({"type": "job.step", "sequence_number": 2, "step": 1, "x": "kept"}))
    assert step is not None and step.step == 1 and step.model_extra == {"x": "kept"}
    assert take(json.dumps({"type": "job.step", "sequence_number": 2})) is None
    assert follow.params() == {"starting_after": 2} and not follow.done
    assert take(json.dumps({"type": "job.failed", "sequence_number": 3})) is not None
    assert follow.done
    assert _follow().take("[DONE]") is None


def test_follow_backs_off_within_bounds_and_gives_up() -> None:
    follow = _follow()
    broken = httpx.ReadError("cut")
    assert [follow.backoff(broken) for _ in range(3)] == [0.5, 1.0, 2.0]
    with pytest.raises(JobsStreamError):
        follow.backoff(broken)
    # An event in between starts the count again; a retry-after is honoured up to the cap.
    follow.take(json.dumps({"type": "job.step", "sequence_number": 1}))
    assert follow.backoff(Reconnect(broken, after=1.5)) == 1.5
    assert follow.backoff(Reconnect(broken, after=30)) == 2.0
    # The store failing mid-stream is said in the stream: resume, do not fail.
    envelope = {"error": {"message": "down", "type": "server_error", "code": "store_unavailable"}}
    with pytest.raises(Reconnect) as down:
        follow.take(json.dumps(envelope))
    assert isinstance(down.value.cause, JobsAPIError)
    assert down.value.cause.code == "store_unavailable"


def _stable(job: Job) -> dict[str, Any]:
    """A job as two reads agree on it: artifacts by name (each read presigns its URLs anew,
    with an expiry counted from that second)."""
    dumped = job.model_dump()
    dumped["artifacts"] = sorted(dumped.get("artifacts") or {})
    return dumped
