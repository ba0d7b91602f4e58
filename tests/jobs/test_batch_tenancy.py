"""OpenAI batches of one tenant cannot stall or break another's (issue 50's attacker's
tests): through a real gateway, a real broker (Tansu), a real S3 API server (SeaweedFS) and
a real worker, over FakeVllm."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import openai

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.jobs.tenants import tenants
from tests.jobstack import jobs_stack
from tests.waiting import eventually
from tiergate.jobs.lines.store import LineBatchStore
from tiergate.jobs.state.store import JobStore


def _jsonl(n: int, tag: str, **body: Any) -> bytes:
    rows = [
        {
            "custom_id": f"{tag}-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"{tag} {i}"}],
                "max_tokens": 8,
                **body,
            },
        }
        for i in range(n)
    ]
    return b"".join(json.dumps(row).encode() + b"\n" for row in rows)


def _completed(client: openai.OpenAI, batch_id: str, timeout: float) -> Any:
    """The batch once it has completed (polled, failing after ``timeout`` seconds)."""
    eventually(
        lambda: client.batches.retrieve(batch_id).status == "completed",
        timeout,
        0.5,
        f"batch {batch_id} completed",
    )
    return client.batches.retrieve(batch_id)


def _submit(client: openai.OpenAI, data: bytes) -> Any:
    upload = client.files.create(file=("in.jsonl", data), purpose="batch")
    return client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )


def test_a_throttled_tenant_does_not_stall_another_tenants_batch(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    """A key over its own requests per minute was refused 429 on every try, and its lines
    were retried in place for line_patience_seconds (900 s) each, holding the worker's
    batch capacity while the other tenant's chunks waited behind them. The throttled key's
    lines are now answered at once with its 429; the other batch finishes in its normal
    time (here: seconds; the bound below is far under the old code's wait)."""
    keys = tenants("throttled", "other", throttled={"requests_per_minute": 3})
    jobs = {"batch_api": {"chunk_lines": 4, "line_concurrency": 2}}
    worker = {"api_key": keys.worker}
    with jobs_stack(broker, s3, model, tmp_path, auth=keys.auth, jobs=jobs, worker=worker) as stack:
        throttled = openai.OpenAI(base_url=f"{stack.base}/v1", api_key=keys.secrets["throttled"])
        other = openai.OpenAI(base_url=f"{stack.base}/v1", api_key=keys.secrets["other"])
        slow_batch = _submit(throttled, _jsonl(12, "throttled"))
        batch = _submit(other, _jsonl(4, "other"))
        stack.start_worker()
        started = time.monotonic()
        _completed(other, batch.id, 60)
        assert time.monotonic() - started < 60
        done = other.batches.retrieve(batch.id)
        assert done.request_counts.completed == 4
        # The throttled batch ends too, every line answered once: its 429s in the errors.
        _completed(throttled, slow_batch.id, 60)
        slow = throttled.batches.retrieve(slow_batch.id)
        counts = slow.request_counts
        assert counts.total == 12 and counts.completed + counts.failed == 12
        assert counts.failed >= 1 and slow.error_file_id is not None
        text = throttled.files.content(slow.error_file_id).text
        errors = [json.loads(x) for x in text.splitlines() if x]
        codes = {e["response"]["body"]["error"]["code"] for e in errors}
        assert codes == {"rate_limit_exceeded"}
        assert {e["response"]["status_code"] for e in errors} == {429}


def test_a_negative_output_bound_fails_its_batch_and_no_later_create(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    """Seen on make up's stack: a batch whose line said "max_tokens": -999 was accepted,
    and every later batches.create of the owner (on the local stack, everyone's) answered
    500 until that batch ended."""
    with jobs_stack(broker, s3, model, tmp_path) as stack:
        client = openai.OpenAI(base_url=f"{stack.base}/v1", api_key="unused")
        bad = _submit(client, _jsonl(1, "bad", max_tokens=-999))
        assert bad.status == "failed" and bad.errors is not None
        assert [(e.code, e.line, e.param) for e in bad.errors.data or []] == [
            ("invalid_value", 1, "body.max_tokens")
        ]
        good = _submit(client, _jsonl(2, "good"))
        assert good.status == "in_progress", good.errors


def test_a_keys_concurrency_limit_is_waited_out_not_answered(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    """The owner's concurrency frees as its own requests end: lines refused for it are
    retried (the gateway names the limit in x-tiergate-limit), and every line completes."""
    model.behaviour.chunk_delay = 0.05
    keys = tenants("narrow", narrow={"max_concurrent": 1})
    jobs = {"batch_api": {"chunk_lines": 4, "line_concurrency": 4}}
    worker = {"api_key": keys.worker}
    with jobs_stack(broker, s3, model, tmp_path, auth=keys.auth, jobs=jobs, worker=worker) as stack:
        client = openai.OpenAI(base_url=f"{stack.base}/v1", api_key=keys.secrets["narrow"])
        batch = _submit(client, _jsonl(8, "narrow"))
        stack.start_worker()
        _completed(client, batch.id, 90)
        assert client.batches.retrieve(batch.id).request_counts.completed == 8


def test_parallel_creates_cannot_pass_the_keys_caps(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    """Attacker's test: the caps were checked without a reservation, so 20 creates at once
    were all accepted against max_active_batches=2 (and past max_enqueued_requests)."""
    jobs = {"batch_api": {"max_active_batches": 2}}
    with jobs_stack(broker, s3, model, tmp_path, jobs=jobs) as stack:
        client = openai.OpenAI(base_url=f"{stack.base}/v1", api_key="unused")
        upload = client.files.create(file=("in.jsonl", _jsonl(3, "cap")), purpose="batch")
        made = asyncio.run(_creates(stack.base, upload.id, 20))
        accepted = [m for m in made if not isinstance(m, Exception)]
        assert 1 <= len([b for b in accepted if b.status == "in_progress"]) <= 2, made
        assert len(_refused(made)) + len(accepted) == 20, made
    jobs = {"batch_api": {"max_active_batches": 100, "max_enqueued_requests": 10}}
    with jobs_stack(broker, s3, model, tmp_path, jobs=jobs) as stack:
        client = openai.OpenAI(base_url=f"{stack.base}/v1", api_key="unused")
        upload = client.files.create(file=("in.jsonl", _jsonl(3, "lines")), purpose="batch")
        made = asyncio.run(_creates(stack.base, upload.id, 20))
        running = [m for m in made if not isinstance(m, Exception) and m.status == "in_progress"]
        assert 1 <= len(running) <= 3, made  # 3 lines each, at most 10 enqueued
        failed = [m for m in made if not isinstance(m, Exception) and m.status == "failed"]
        assert all(f.errors.data[0].code == "request_limit_exceeded" for f in failed)
        assert len(running) + len(failed) + len(_refused(made)) == 20, made


def _refused(made: list[Any]) -> list[Any]:
    """The creates refused 429: over the key's batches, over its reads in flight (a
    create reads the plan stored with its input file), or over its share of the
    replica's spooled transfers (a create without a plan reads the file to disk)."""
    refused = [m for m in made if isinstance(m, openai.RateLimitError)]
    codes = {m.code for m in refused}
    allowed = {"too_many_batches", "too_many_concurrent_reads", "too_many_concurrent_uploads"}
    assert codes <= allowed, codes
    return refused


async def _creates(base: str, file_id: str, n: int) -> list[Any]:
    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    async with client:
        return list(
            await asyncio.gather(
                *(
                    client.batches.create(
                        input_file_id=file_id,
                        endpoint="/v1/chat/completions",
                        completion_window="24h",
                    )
                    for _ in range(n)
                ),
                return_exceptions=True,
            )
        )


def test_a_batch_whose_input_file_was_deleted_still_answers_every_line(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    """Deleting a running batch's input file made its lines vanish (completed + failed <
    total, the batch never accounted for). Each line is now answered once, as an error."""
    with jobs_stack(broker, s3, model, tmp_path, jobs={"batch_api": {"chunk_lines": 2}}) as stack:
        client = openai.OpenAI(base_url=f"{stack.base}/v1", api_key="unused")
        batch = _submit(client, _jsonl(5, "gone"))
        client.files.delete(batch.input_file_id)
        stack.start_worker()
        _completed(client, batch.id, 60)
        done = client.batches.retrieve(batch.id)
        assert (done.request_counts.total, done.request_counts.failed) == (5, 5)
        assert done.error_file_id is not None
        errors = [json.loads(x) for x in client.files.content(done.error_file_id).text.splitlines()]
        assert [e["error"]["code"] for e in errors] == ["input_file_deleted"] * 5
        assert len({e["id"] for e in errors}) == 5


def test_a_finished_batchs_answers_live_in_its_files_alone(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    """The chunks' answers stayed in storage after the batch was final, so an owner who
    deleted its output file still had every answer kept. Once the files are written the
    chunks' copies are removed, and a chunk delivered again does not write them back."""
    with jobs_stack(broker, s3, model, tmp_path, jobs={"batch_api": {"chunk_lines": 2}}) as stack:
        client = openai.OpenAI(base_url=f"{stack.base}/v1", api_key="unused")
        batch = _submit(client, _jsonl(5, "kept"))
        stack.start_worker()
        _completed(client, batch.id, 60)
        done = client.batches.retrieve(batch.id)
        assert done.request_counts.completed == 5 and done.output_file_id is not None
        store = JobStore(stack.settings.jobs.storage)
        lines = LineBatchStore(store)
        assert [lines.chunk("anonymous", batch.id, c) for c in range(3)] == [None] * 3
        client.files.delete(done.output_file_id)
        leftover = [k for k in store.objects.keys(store.prefixed("batchapi/")) if batch.id in k]
        assert not [k for k in leftover if "/chunks/" in k], leftover
