"""OpenAI's Batch API as the official ``openai`` client runs it (upload, create, poll,
download, list, cancel), through a real gateway, a real broker (Tansu), a real S3 API server
(SeaweedFS) and real workers, over FakeVllm: one answer per input line, the engine's
refusals in the error file, validation errors naming their lines, a batch another key
cannot see, a cancel that keeps what finished, a worker stopped mid-chunk."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.jobs.tenants import tenants
from tests.jobstack import jobs_stack
from tests.readme_blocks import assert_node_batch_guide, run_readme_block
from tests.waiting import eventually
from tiergate.enginesettings import DEFAULT_MODEL_NAME
from tiergate.jobs.state.files import FileStore


def _line(i: int, **body: Any) -> dict[str, Any]:
    return {
        "custom_id": f"request-{i}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"hi {i}"}],
            "max_tokens": 8,
            **body,
        },
    }


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(row).encode() + b"\n" for row in rows)


def _wait(client: openai.OpenAI, batch_id: str, statuses: set[str], timeout: float = 180) -> Any:
    seen: list[Any] = []

    def reached() -> bool:
        seen.append(client.batches.retrieve(batch_id))
        return seen[-1].status in statuses

    eventually(reached, timeout, 0.5, f"batch {batch_id} {'/'.join(sorted(statuses))}")
    return seen[-1]


def _answers(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    text = client.files.content(file_id).text
    return [json.loads(line) for line in text.splitlines() if line]


def test_a_batch_answers_every_line_once_and_is_its_keys_alone(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    keys = tenants("alice", "bob")
    jobs = {"batch_api": {"chunk_lines": 4}}
    worker = {"api_key": keys.worker}
    with jobs_stack(broker, s3, model, tmp_path, auth=keys.auth, jobs=jobs, worker=worker) as stack:
        client = openai.OpenAI(base_url=f"{stack.base}/v1", api_key=keys.secrets["alice"])
        bob = openai.OpenAI(base_url=f"{stack.base}/v1", api_key=keys.secrets["bob"])
        # 21 requests; one asks for more tokens than the gateway allows: its refusal is a
        # line of the error file, never a lost line.
        rows = [_line(i) for i in range(20)] + [_line(20, max_tokens=10**6)]
        batch_input_file = client.files.create(file=("in.jsonl", _jsonl(rows)), purpose="batch")
        batch = client.batches.create(
            input_file_id=batch_input_file.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata={"description": "nightly eval job"},
        )
        assert batch.status == "in_progress", batch.errors
        assert batch.request_counts.total == 21
        with pytest.raises(openai.NotFoundError):
            bob.batches.retrieve(batch.id)
        stack.start_worker()
        done = _wait(client, batch.id, {"completed", "failed", "expired", "cancelled"})
        assert done.status == "completed", done
        errors = _answers(client, done.error_file_id)
        assert (done.request_counts.completed, done.request_counts.failed) == (20, 1), errors[:2]
        assert done.metadata == {"description": "nightly eval job"}
        assert done.usage.output_tokens > 0 and done.completed_at is not None
        outputs = _answers(client, done.output_file_id)
        errors = _answers(client, done.error_file_id)
        assert sorted(o["custom_id"] for o in outputs) == sorted(f"request-{i}" for i in range(20))
        for output in outputs:
            assert output["response"]["status_code"] == 200 and output["error"] is None
            assert output["response"]["body"]["choices"][0]["message"]["content"]
            assert output["id"].startswith("batch_req_")
        assert [e["custom_id"] for e in errors] == ["request-20"]
        assert errors[0]["response"]["status_code"] == 400
        assert errors[0]["response"]["body"]["error"]["code"] == "max_tokens_too_large"
        assert [b.id for b in client.batches.list().data] == [batch.id]
        assert bob.batches.list().data == []
        with pytest.raises(openai.NotFoundError):
            bob.files.content(done.output_file_id)


def test_an_invalid_input_file_fails_the_batch_naming_its_lines(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    with jobs_stack(broker, s3, model, tmp_path) as stack:
        client = openai.OpenAI(base_url=f"{stack.base}/v1", api_key="unused")
        wrong_url = {**_line(2), "url": "/v1/completions"}
        other_model = _line(3, model="another-model")
        rows = [_line(0), _line(0), wrong_url, other_model]
        upload = client.files.create(file=("in.jsonl", _jsonl(rows)), purpose="batch")
        batch = client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert batch.status == "failed" and batch.failed_at is not None
        assert batch.errors is not None
        found = {(e.line, e.code) for e in batch.errors.data or []}
        assert found == {(2, "duplicate_custom_id"), (3, "invalid_url"), (4, "mismatched_model")}
        assert client.batches.retrieve(batch.id).status == "failed"
        with pytest.raises(openai.BadRequestError):
            client.batches.create(
                input_file_id="file-" + "0" * 32,
                endpoint="/v1/chat/completions",
                completion_window="24h",
            )


def test_a_key_makes_a_bounded_number_of_failed_batches_a_day(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    """Attacker's test: a failed batch is stored (with its lines' errors, as OpenAI keeps
    it) and counted against nothing, so one key could fill storage with them. Past
    jobs.batch_api.max_failed_batches_per_day the create is refused and stores nothing;
    a good batch still goes through."""
    batch_api = {"max_failed_batches_per_day": 2}
    with jobs_stack(broker, s3, model, tmp_path, jobs={"batch_api": batch_api}) as stack:
        client = openai.OpenAI(base_url=f"{stack.base}/v1", api_key="unused", max_retries=0)
        bad = client.files.create(file=("in.jsonl", _jsonl([_line(0), _line(0)])), purpose="batch")
        made = [
            client.batches.create(
                input_file_id=bad.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            for _ in range(2)
        ]
        assert [b.status for b in made] == ["failed", "failed"]
        with pytest.raises(openai.RateLimitError) as refused:
            client.batches.create(
                input_file_id=bad.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
        assert refused.value.code == "too_many_failed_batches"
        assert "used by an earlier line" in refused.value.message  # what this one failed with
        listed = [b.id for b in client.batches.list()]
        assert sorted(listed) == sorted(b.id for b in made)  # the refused one: nowhere
        good = client.files.create(file=("in.jsonl", _jsonl([_line(0)])), purpose="batch")
        batch = client.batches.create(
            input_file_id=good.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert batch.status == "in_progress"


def test_a_create_uses_the_plan_made_at_upload_and_reads_the_file_only_without_one(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 50 item 2: the input is checked once, at upload; the create reads its stored
    plan, not the file. A file without a plan (uploaded before plans were stored) is read
    and checked at the create as before, and both run every line once."""
    reads: list[str] = []
    whole = FileStore.content_to

    def counted(self: FileStore, owner: str, file_id: str, path: Path) -> bool:
        reads.append(file_id)
        return whole(self, owner, file_id, path)

    monkeypatch.setattr(FileStore, "content_to", counted)
    with jobs_stack(broker, s3, model, tmp_path, jobs={"batch_api": {"chunk_lines": 3}}) as stack:
        client = openai.OpenAI(base_url=f"{stack.base}/v1", api_key="unused")
        planned = client.files.create(
            file=("in.jsonl", _jsonl([_line(i) for i in range(10)])), purpose="batch"
        )
        batch = client.batches.create(
            input_file_id=planned.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert batch.status == "in_progress" and reads == []
        assert batch.request_counts is not None and batch.request_counts.total == 10
        # An older file: no plan stored with it.
        monkeypatch.setattr(FileStore, "plan", lambda self, owner, file_id: None)
        unplanned = client.files.create(
            file=("old.jsonl", _jsonl([_line(i) for i in range(7)])), purpose="batch"
        )
        older = client.batches.create(
            input_file_id=unplanned.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert older.status == "in_progress" and reads == [unplanned.id]
        stack.start_worker()
        for done, total in ((batch, 10), (older, 7)):
            ended = _wait(client, done.id, {"completed"})
            outputs = _answers(client, ended.output_file_id)
            assert sorted(o["custom_id"] for o in outputs) == sorted(
                f"request-{i}" for i in range(total)
            )


def test_a_cancelled_batch_stops_and_keeps_what_finished(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    model.behaviour.chunk_delay = 0.2
    jobs = {"batch_api": {"chunk_lines": 2, "line_concurrency": 1, "cancel_grace_seconds": 2}}
    with jobs_stack(broker, s3, model, tmp_path, jobs=jobs) as stack:
        client = openai.OpenAI(base_url=f"{stack.base}/v1", api_key="unused")
        upload = client.files.create(
            file=("in.jsonl", _jsonl([_line(i) for i in range(40)])), purpose="batch"
        )
        batch = client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        stack.start_worker()
        eventually(
            lambda: client.batches.retrieve(batch.id).request_counts.completed >= 2,
            120,
            0.3,
            "some lines answered",
        )
        cancelling = client.batches.cancel(batch.id)
        assert cancelling.status in ("cancelling", "cancelled")
        started = time.monotonic()
        done = _wait(client, batch.id, {"cancelled", "completed"}, timeout=60)
        assert done.status == "cancelled" and time.monotonic() - started < 30
        completed = done.request_counts.completed
        assert 2 <= completed < 40
        outputs = _answers(client, done.output_file_id)
        assert len(outputs) == completed
        assert len({o["custom_id"] for o in outputs}) == completed  # none twice
        served = model.record.requests
        time.sleep(2)  # the worker has let the rest of the batch go: no more engine calls
        assert model.record.requests <= served + 1


def test_a_worker_stopped_mid_batch_leaves_no_line_lost_or_doubled(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    model.behaviour.chunk_delay = 0.05
    jobs = {"batch_api": {"chunk_lines": 3, "line_concurrency": 2}}
    with jobs_stack(broker, s3, model, tmp_path, jobs=jobs) as stack:
        client = openai.OpenAI(base_url=f"{stack.base}/v1", api_key="unused")
        upload = client.files.create(
            file=("in.jsonl", _jsonl([_line(i) for i in range(30)])), purpose="batch"
        )
        batch = client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        first = stack.start_worker()
        eventually(
            lambda: client.batches.retrieve(batch.id).request_counts.completed >= 3,
            120,
            0.2,
            "the first worker answering",
        )
        first.stop(drain_seconds=0)  # mid-chunk: its chunk is not written, not committed
        stack.workers.remove(first)
        stack.start_worker()
        done = _wait(client, batch.id, {"completed", "failed", "cancelled", "expired"})
        assert done.status == "completed", done
        outputs = _answers(client, done.output_file_id)
        ids = [o["custom_id"] for o in outputs]
        assert sorted(ids) == sorted(f"request-{i}" for i in range(30))  # each exactly once


def test_the_manuals_batch_example_runs_as_written(broker: str, s3: str, tmp_path: Path) -> None:
    """The manual's example names the model ``make up`` serves: a fake of that name here."""
    engine = FakeVllm(DEFAULT_MODEL_NAME).start()
    try:
        with jobs_stack(broker, s3, engine, tmp_path) as stack:
            stack.start_worker()
            done = run_readme_block("batch-python", stack.base, tmp_path, timeout=300)
            assert done.returncode == 0, done.stderr[-3000:]
            lines = done.stdout.splitlines()
            assert lines[0].startswith("completed ") and "completed=3" in lines[0], lines
            assert sorted(line.split()[0] for line in lines[1:]) == [
                "request-1",
                "request-2",
                "request-3",
            ]
    finally:
        engine.stop()


def test_the_manuals_node_batch_guide_runs_as_written(broker: str, s3: str, tmp_path: Path) -> None:
    """The official Node client through the same guide, over a fake of ``make up``'s model
    (with real engines: tests/e2e/test_readme_jobs_client.py)."""
    engine = FakeVllm(DEFAULT_MODEL_NAME).start()
    try:
        with jobs_stack(broker, s3, engine, tmp_path) as stack:
            stack.start_worker()
            done = run_readme_block("batch-node", stack.base, tmp_path, timeout=300)
            assert done.returncode == 0, done.stderr[-3000:]
            assert_node_batch_guide(done.stdout)
    finally:
        engine.stop()
