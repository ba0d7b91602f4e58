"""Agent jobs end to end: API -> Kafka (Tansu) -> worker -> bubblewrap -> S3 (SeaweedFS)."""

from __future__ import annotations

import io
import json
import tarfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.jobstack import jobs_stack, topic_messages
from tests.waiting import eventually
from tiergate.gateway.access.auth import new_key
from tiergate.jobs.run.context import RunContext
from tiergate.jobs.run.runner import JobRunner
from tiergate.jobs.state.store import JobStore
from tiergate.protocol import JobCreate, JobMessage
from tiergate.queue.pipeline import JobQueue

SOLVE = "```bash\necho $(( 6 * 7 )) > answer.txt\n```"
TASK: dict[str, Any] = {
    "model": MODEL,
    "service_tier": "priority",
    "instruction": "Write six times seven into answer.txt.",
    "workspace": {"files": {"README.md": "the task\n"}},
    "verifier": {
        "command": 'test "$(cat answer.txt)" = 42 && echo 1 > reward.txt',
        "reward_file": "reward.txt",
    },
    "limits": {"max_steps": 4, "timeout_seconds": 60},
}


def _sse(text: str) -> list[dict[str, Any]]:
    events = []
    for part in text.split("\n\n"):
        if part.startswith("data: ") and part != "data: [DONE]":
            events.append(json.loads(part[6:]))
    return events


def test_job_runs_to_a_verified_result(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    model.behaviour.replies = [SOLVE, "DONE"]
    with jobs_stack(broker, s3, model, tmp_path) as stack:
        job = stack.submit(TASK)
        assert job["status"] == "queued" and job["object"] == "job"
        assert job["id"].startswith("job_") and job["artifacts"] == {}
        stack.start_worker()
        done = stack.wait(job["id"], lambda j: j["status"] not in ("queued", "in_progress"))
        assert done["status"] == "completed", done
        assert done["result"] == {
            "passed": True,
            "reward": 1.0,
            "rewards": None,
            "verifier_exit_code": 0,
        }
        assert done["steps"] == 1 and done["started_at"] and done["completed_at"]
        # The model was called through the gateway on the job's tier.
        assert all(b.get("service_tier") is None for b in model.record.bodies)  # stripped
        assert set(done["artifacts"]) == {"trajectory", "workspace", "verifier_log", "result"}
        trajectory = [
            json.loads(line)
            for line in httpx.get(done["artifacts"]["trajectory"]).text.splitlines()
        ]
        commands = [t for t in trajectory if t["type"] == "command"]
        assert commands[0]["command"] == "echo $(( 6 * 7 )) > answer.txt"
        assert commands[0]["exit_code"] == 0
        assert {t["service_tier"] for t in trajectory if t["type"] == "model"} == {"priority"}
        archive = httpx.get(done["artifacts"]["workspace"]).content
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            answer = tar.extractfile("workspace/answer.txt")
            assert answer is not None and answer.read() == b"42\n"
        assert json.loads(httpx.get(done["artifacts"]["result"]).text)["status"] == "completed"

        events = _sse(httpx.get(f"{stack.base}/v1/jobs/{job['id']}/events").text)
        assert [e["sequence_number"] for e in events] == list(range(1, len(events) + 1))
        assert events[0]["type"] == "job.queued" and events[-1]["type"] == "job.completed"
        assert any(e["type"] == "job.step" and e["exit_code"] == 0 for e in events)
        resumed = _sse(
            httpx.get(f"{stack.base}/v1/jobs/{job['id']}/events", params={"starting_after": 2}).text
        )
        assert [e["sequence_number"] for e in resumed] == list(range(3, len(events) + 1))

        listed = httpx.get(f"{stack.base}/v1/jobs").json()
        assert listed["object"] == "list" and listed["data"][0]["id"] == job["id"]


def test_bad_job_specs_are_refused_and_nothing_is_queued(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    with jobs_stack(broker, s3, model, tmp_path) as stack:
        url = f"{stack.base}/v1/jobs"
        cases = [
            ({"model": MODEL}, 400, "instruction"),
            ({**TASK, "workspace": {"files": {"../escape": "x"}}}, 400, "workspace"),
            ({**TASK, "limits": {"max_steps": 0}}, 400, "limits.max_steps"),
            ({**TASK, "service_tier": "turbo"}, 400, "service_tier"),
            ({**TASK, "model": "nope"}, 404, "model"),
            ({**TASK, "surprise": 1}, 400, "surprise"),
        ]
        for body, status, param in cases:
            resp = httpx.post(url, json=body)
            assert resp.status_code == status, (body, resp.text)
            assert resp.json()["error"]["param"] == param
        assert httpx.post(url, content=b"{").json()["error"]["code"] == "invalid_json"
        huge = {**TASK, "workspace": {"files": {"big.txt": "x" * (5 * 1024 * 1024)}}}
        assert httpx.post(url, json=huge).json()["error"]["code"] == "request_too_large"
        assert httpx.get(url).json()["data"] == []


def test_kafka_down_means_503_and_no_job(
    s3: str, model: FakeVllm, tmp_path: Path, broker: str
) -> None:
    with jobs_stack(broker, s3, model, tmp_path) as stack:
        pass  # topics and bucket exist; now point a gateway at a broker that is not there
    dead = f"127.0.0.1:{__import__('tests.servers', fromlist=['x']).free_port()}"
    from tests.servers import gateway_settings, running_gateway

    tree = stack.settings.jobs.model_dump()
    tree["kafka"]["bootstrap_servers"] = dead
    tree["kafka"]["request_timeout_seconds"] = 1.0
    settings = gateway_settings([model.url], [model.url], jobs=tree)
    with running_gateway(settings) as base:
        resp = httpx.post(f"{base}/v1/jobs", json=TASK, timeout=30)
        assert resp.status_code == 503, resp.text
        assert resp.json()["error"]["code"] == "queue_unavailable"
        assert httpx.get(f"{base}/v1/jobs").json()["data"] == []


def test_cancel_queued_job_is_final_and_idempotent(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    model.behaviour.replies = [SOLVE, "DONE"]
    with jobs_stack(broker, s3, model, tmp_path) as stack:
        job = stack.submit(TASK)
        first = httpx.post(f"{stack.base}/v1/jobs/{job['id']}/cancel").json()
        again = httpx.post(f"{stack.base}/v1/jobs/{job['id']}/cancel").json()
        assert first["status"] == again["status"] == "cancelled"
        worker = stack.start_worker()
        eventually(lambda: worker.processed, 30, 0.2, "the worker took the message")
        assert worker.processed == [(job["id"], "skipped")]
        assert stack.wait(job["id"], lambda j: True)["status"] == "cancelled"
        assert model.record.requests == 0
        events = _sse(httpx.get(f"{stack.base}/v1/jobs/{job['id']}/events", timeout=30).text)
        assert [e["type"] for e in events] == ["job.queued", "job.cancelled"]


def test_cancel_running_job_stops_it_within_seconds(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    model.behaviour.replies = ["```bash\nsleep 60\n```"]
    with jobs_stack(broker, s3, model, tmp_path) as stack:
        job = stack.submit({**TASK, "limits": {"timeout_seconds": 120}})
        stack.start_worker()
        stack.wait(job["id"], lambda j: j["status"] == "in_progress")
        # The model has answered with the command, which now runs in the sandbox.
        eventually(lambda: model.record.requests >= 1, 30, 0.05, "the model asked")
        asked = time.monotonic()
        answer = httpx.post(f"{stack.base}/v1/jobs/{job['id']}/cancel").json()
        assert answer["cancel_requested_at"]
        final = stack.wait(job["id"], lambda j: j["status"] == "cancelled", timeout=15)
        assert time.monotonic() - asked < 5
        assert final["result"] is None
        again = httpx.post(f"{stack.base}/v1/jobs/{job['id']}/cancel").json()
        assert again["status"] == "cancelled"


def test_max_steps_ends_incomplete_with_the_verifier_result(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    model.behaviour.replies = ["```bash\necho still working\n```"]
    with jobs_stack(broker, s3, model, tmp_path) as stack:
        job = stack.submit({**TASK, "limits": {"max_steps": 2}})
        stack.start_worker()
        final = stack.wait(job["id"], lambda j: j["status"] == "incomplete")
        assert final["incomplete_details"] == {"reason": "max_steps"}
        assert final["steps"] == 2
        assert final["result"]["passed"] is False


def test_jobs_belong_to_the_key_that_created_them(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    (key_a, hash_a), (key_b, hash_b) = new_key(), new_key()
    auth = {"enabled": True, "keys": [{"name": "a", "hash": hash_a}, {"name": "b", "hash": hash_b}]}
    with jobs_stack(broker, s3, model, tmp_path, auth=auth) as stack:
        a = {"authorization": f"Bearer {key_a}"}
        b = {"authorization": f"Bearer {key_b}"}
        job = stack.submit(TASK, headers=a)
        assert httpx.get(f"{stack.base}/v1/jobs/{job['id']}", headers=a).status_code == 200
        for method, path in (("GET", ""), ("POST", "/cancel"), ("GET", "/events")):
            resp = httpx.request(method, f"{stack.base}/v1/jobs/{job['id']}{path}", headers=b)
            assert resp.status_code == 404
        assert httpx.get(f"{stack.base}/v1/jobs", headers=b).json()["data"] == []
        assert httpx.get(f"{stack.base}/v1/jobs", headers=a).json()["data"][0]["id"] == job["id"]
        assert httpx.post(f"{stack.base}/v1/jobs", json=TASK).status_code == 401


def test_list_pages_newest_first(broker: str, s3: str, model: FakeVllm, tmp_path: Path) -> None:
    with jobs_stack(broker, s3, model, tmp_path) as stack:
        ids = []
        for _ in range(3):
            ids.append(stack.submit(TASK)["id"])  # within one second: ordered by milliseconds
        page = httpx.get(f"{stack.base}/v1/jobs", params={"limit": 2}).json()
        assert [j["id"] for j in page["data"]] == ids[::-1][:2] and page["has_more"]
        rest = httpx.get(
            f"{stack.base}/v1/jobs", params={"limit": 2, "after": page["last_id"]}
        ).json()
        assert [j["id"] for j in rest["data"]] == [ids[0]] and not rest["has_more"]


def test_redelivered_job_runs_once_and_result_is_written_once(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    model.behaviour.replies = [SOLVE, "DONE"]
    with jobs_stack(broker, s3, model, tmp_path) as stack:
        job = stack.submit(TASK)
        store = JobStore(stack.jobs.storage)
        runner = JobRunner(RunContext(stack.jobs, store, JobQueue(stack.jobs.kafka)))
        message = JobMessage(id=job["id"], owner="anonymous", spec=JobCreate.model_validate(TASK))
        assert runner.process(message) == "finished"
        requests_after_first = model.record.requests
        assert runner.process(message) == "skipped"
        assert model.record.requests == requests_after_first
        final = store.final(job["id"])
        assert final is not None and not store.finalize(final)  # the conditional put holds


def _serves(base: str) -> bool:
    """The gateway took the model back (it set it aside after the 503s)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    return httpx.post(f"{base}/v1/chat/completions", json=body, timeout=10).status_code == 200


def test_a_copy_of_a_failed_attempts_message_is_skipped_while_its_retry_waits(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    """A worker that took a job over from a busy one's partition, or a redelivery after a
    rebalance, can hand a slot the message of an attempt that already failed: it must not
    run the job again nor count towards max_attempts; the retry's message (attempt 2) runs."""
    model.behaviour.mode = "status"
    model.behaviour.status = 503
    with jobs_stack(
        broker, s3, model, tmp_path, worker={"max_attempts": 2, "retry_backoff_seconds": 60}
    ) as stack:
        job = stack.submit(TASK)
        store = JobStore(stack.jobs.storage)
        runner = JobRunner(RunContext(stack.jobs, store, JobQueue(stack.jobs.kafka)))
        first = JobMessage(id=job["id"], owner="anonymous", spec=JobCreate.model_validate(TASK))
        assert runner.process(first) == "retry"
        waiting = store.get(job["id"])
        assert waiting is not None and waiting.error is not None
        assert (waiting.error["code"], waiting.error["attempt"]) == ("retrying", 1)
        requests = model.record.requests
        assert runner.process(first) == "skipped"  # the copy
        assert model.record.requests == requests
        assert store.deliveries(job["id"]) == 1
        model.behaviour.mode = "ok"
        eventually(lambda: _serves(stack.base), 30, 0.2, "the gateway serves the model again")
        model.behaviour.replies = [SOLVE, "DONE"]
        retry = first.model_copy(update={"attempt": 2})
        assert runner.process(retry) == "finished"
        final = store.final(job["id"])
        assert final is not None and final.status.value == "completed", final
        assert final.attempts == 2


def test_model_down_retries_with_backoff_then_dead_letters(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    with jobs_stack(
        broker, s3, model, tmp_path, worker={"max_attempts": 2, "retry_backoff_seconds": 0.5}
    ) as stack:
        job = stack.submit(TASK)
        model.behaviour.mode = "status"
        model.behaviour.status = 503
        stack.start_worker()
        final = stack.wait(job["id"], lambda j: j["status"] == "failed", timeout=60)
        assert final["error"]["code"] == "transient_failures"
        assert final["attempts"] == 2
        dead = topic_messages(stack.jobs, stack.jobs.kafka.dead_letter_topic)
        assert [d["id"] for d in dead] == [job["id"]]


def test_drained_worker_hands_its_job_to_another(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    model.behaviour.replies = ["```bash\nsleep 4 && echo 42 > answer.txt\n```", "DONE"]
    with jobs_stack(broker, s3, model, tmp_path) as stack:
        job = stack.submit(TASK)
        first = stack.start_worker()
        stack.wait(job["id"], lambda j: j["status"] == "in_progress")
        eventually(lambda: model.record.requests >= 1, 30, 0.05, "the model asked")
        first.stop(drain_seconds=0)  # SIGTERM with no grace left: abandon, do not commit
        assert first.processed == [(job["id"], "abandoned")]
        model.behaviour.replies = [SOLVE, "DONE"]
        stack.start_worker()
        final = stack.wait(job["id"], lambda j: j["status"] == "completed", timeout=90)
        assert final["result"]["passed"] is True
        assert final["attempts"] == 1


def test_a_draining_worker_lets_its_running_job_finish(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    """The README's drain: a worker told to stop (SIGTERM's path) with time left takes no
    new job, and the one it runs finishes there, once, before it exits."""
    model.behaviour.replies = ["```bash\nsleep 3 && echo 42 > answer.txt\n```", "DONE"]
    with jobs_stack(broker, s3, model, tmp_path) as stack:
        job = stack.submit(TASK)
        worker = stack.start_worker()
        stack.wait(job["id"], lambda j: j["status"] == "in_progress")
        eventually(lambda: model.record.requests >= 1, 30, 0.05, "the model asked")
        worker.stop(drain_seconds=60)  # returns once its job has ended
        assert worker.processed == [(job["id"], "finished")]
        final = httpx.get(f"{stack.base}/v1/jobs/{job['id']}").json()
        assert final["status"] == "completed" and final["result"]["passed"] is True, final
        assert (final["attempts"], final["run"]) == (1, 1)


def test_job_whose_verifier_fails_completes_with_passed_false(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    model.behaviour.replies = ["```bash\necho 41 > answer.txt\n```", "DONE"]
    verifier = {"command": 'v=$(cat answer.txt); echo "expected 42, got $v"; test "$v" = 42'}
    with jobs_stack(broker, s3, model, tmp_path) as stack:
        job = stack.submit({**TASK, "verifier": verifier})
        stack.start_worker()
        final = stack.wait(job["id"], lambda j: j["status"] not in ("queued", "in_progress"))
        assert final["status"] == "completed"
        assert final["result"] == {
            "passed": False,
            "reward": None,
            "rewards": None,
            "verifier_exit_code": 1,
        }
        log = httpx.get(final["artifacts"]["verifier_log"]).text
        assert log.strip() == "expected 42, got 41"  # the verifier's own output, whole


def test_concurrent_creates_with_one_idempotency_key_give_one_job(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    senders = 8
    with jobs_stack(broker, s3, model, tmp_path, jobs={"max_outstanding_jobs": 20}) as stack:
        start = threading.Barrier(senders)

        def create(_: int) -> httpx.Response:
            start.wait(10)  # every create in flight at once
            return httpx.post(
                f"{stack.base}/v1/jobs", json=TASK, headers={"idempotency-key": "race-1"}
            )

        with ThreadPoolExecutor(senders) as pool:
            answers = list(pool.map(create, range(senders)))
        assert [a.status_code for a in answers] == [200] * senders, [a.text for a in answers]
        ids = {a.json()["id"] for a in answers}
        assert len(ids) == 1
        assert [m["id"] for m in topic_messages(stack.jobs, stack.jobs.kafka.topic)] == [*ids]
        assert len(httpx.get(f"{stack.base}/v1/jobs").json()["data"]) == 1
