"""Reads have a cost limit per owner (issue 33 item 3): a key that polls its jobs as hard
as it can is held to ``jobs.read_units_per_minute``, charged what each read really cost
in object-store calls and bytes (tiergate/gateway/access/readcost.py), and another key's reads
go on untouched. Through a real gateway, Kafka and S3."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.jobs.tenants import tenants
from tests.jobstack import jobs_stack
from tests.waiting import eventually
from tiergate.gateway.access.readcost import UNIT_BYTES, units
from tiergate.jobs.batches.store import BatchStore
from tiergate.jobs.state.store import JobStore
from tiergate.jobsettings import StorageSettings
from tiergate.objectstore import ObjectStore
from tiergate.protocol.batches import Batch, Rollout

JOB: dict[str, Any] = {
    "model": MODEL,
    "instruction": "Nothing.",
    "workspace": {"files": {"a.txt": "a\n"}},
    "verifier": {"command": "true"},
    "limits": {"max_steps": 1, "timeout_seconds": 30},
}


def test_a_metered_call_counts_its_store_calls_and_bytes(s3: str) -> None:
    store = ObjectStore(StorageSettings(endpoint_url=s3, bucket="meter-test"))
    store.ensure_bucket()
    for i in range(3):
        store.put(f"obj{i}", b"x" * (100 * 1024))

    def read_all() -> list[bytes | None]:
        return [store.get(k) for k in store.keys("obj")]

    got, meter = store.metered(read_all)
    assert len(got) == 3 and all(b is not None and len(b) == 100 * 1024 for b in got)
    assert (meter.calls, meter.read_bytes) == (4, 300 * 1024)  # one LIST, three GETs
    assert units(meter) == 4 + -(-300 * 1024 // UNIT_BYTES)
    # Nothing is counted outside a metered call, nor in another thread's.
    _, other = store.metered(lambda: None)
    worker = threading.Thread(target=lambda: store.get("obj0"))
    worker.start()
    worker.join()
    assert (other.calls, other.read_bytes) == (0, 0)


def test_one_keys_polling_is_held_to_its_read_budget_and_another_keys_reads_go_on(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    keys = tenants("mallory", "alice")
    mallory, alice = keys.headers("mallory"), keys.headers("alice")
    # 600 units a minute: 10 a second, a bucket of 600.
    with jobs_stack(
        broker, s3, model, tmp_path, auth=keys.auth, jobs={"read_units_per_minute": 600}
    ) as stack:  # no worker: the jobs stay queued
        url = f"{stack.base}/v1/jobs"
        for headers in (mallory, mallory, mallory, alice):
            created = httpx.post(url, json=JOB, headers=headers)
            assert created.status_code == 200, created.text
        ours = created.json()["id"]

        # Each list reads an index LIST and two objects a queued job (its status, and the
        # terminal record it looks for): 7 units, so the bucket of 600 lasts about 85.
        refused: httpx.Response | None = None
        for n in range(400):  # noqa: B007 (n is read after the loop)
            resp = httpx.get(url, headers=mallory)
            if resp.status_code == 429:
                refused = resp
                break
            assert resp.status_code == 200, resp.text
            assert len(resp.json()["data"]) == 3
        assert refused is not None, "400 lists of 3 jobs, none refused"
        assert 60 <= n <= 120, f"refused after {n} lists"
        error = refused.json()["error"]
        assert (error["code"], error["type"]) == ("read_rate_limited", "rate_limit_error")
        assert "jobs.read_units_per_minute" in error["message"]
        assert int(refused.headers["retry-after"]) >= 1
        # The other key's reads are not touched.
        assert httpx.get(f"{url}/{ours}", headers=alice).status_code == 200
        assert httpx.get(url, headers=alice).status_code == 200
        # The bucket refills at 10 units a second: a list (7) is allowed again soon.
        started = time.monotonic()
        eventually(
            lambda: httpx.get(url, headers=mallory).status_code == 200,
            10,
            0.5,
            what="the key's reads allowed again",
        )
        assert time.monotonic() - started < 8


def test_an_event_stream_over_the_budget_waits_instead_of_failing(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    """Opening a stream past the budget is a 429; a stream already open only slows down,
    and still ends with the job's terminal event."""
    keys = tenants("mallory")
    mallory = keys.headers("mallory")
    with jobs_stack(
        broker, s3, model, tmp_path, auth=keys.auth, jobs={"read_units_per_minute": 120}
    ) as stack:
        url = f"{stack.base}/v1/jobs"
        created = httpx.post(url, json=JOB, headers=mallory)
        assert created.status_code == 200, created.text
        job_id = created.json()["id"]
        with httpx.stream("GET", f"{url}/{job_id}/events", headers=mallory, timeout=60) as stream:
            assert stream.status_code == 200
            # Spend the bucket with GETs while the stream is open.
            eventually(
                lambda: httpx.get(f"{url}/{job_id}", headers=mallory).status_code == 429,
                30,
                0.01,
                what="the budget spent",
            )
            refused = httpx.get(f"{url}/{job_id}/events", headers=mallory)
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == "read_rate_limited"
            cancelled: list[int] = []

            def cancel() -> None:
                resp = eventually(
                    lambda: (
                        r
                        if (r := httpx.post(f"{url}/{job_id}/cancel", headers=mallory)).status_code
                        != 429
                        else None
                    ),
                    30,
                    0.5,
                    what="the cancel accepted",
                )
                cancelled.append(resp.status_code)

            canceller = threading.Thread(target=cancel)
            canceller.start()
            lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
            canceller.join()
        assert cancelled == [200]
        assert lines[-1] == "data: [DONE]"
        assert '"job.cancelled"' in lines[-2], lines[-2]


def test_a_batch_streams_polls_read_its_state_again_only_when_it_changed(s3: str) -> None:
    """A 20,000-rollout batch's state is 7 MB: each poll of an event stream fetched and
    parsed it again. The stream's reader asks the store with the state's ETag, so a poll
    while nothing changed costs one call and no bytes, and hands back the batch it has."""
    store = JobStore(StorageSettings(endpoint_url=s3, bucket=f"states-{uuid.uuid4().hex[:8]}"))
    store.ensure_bucket()
    batches = BatchStore(store)
    rollouts = [
        Rollout(job_id=f"job_{i}", domain="d", task_id=f"t{i}", sample=0, round=1)
        for i in range(2000)
    ]
    batch = Batch(id="batch_x", owner="o", created_at=1, samples_per_task=1, rounds=1)
    batch.rollouts = rollouts
    batches.put_state(batch)
    read = batches.state_reader("o", "batch_x")
    first, meter = store.objects.metered(read)
    assert first is not None and len(first.rollouts) == 2000
    assert meter.read_bytes > 200_000, meter
    again, meter = store.objects.metered(read)
    assert again is first and (meter.calls, meter.read_bytes) == (1, 0)
    batch.rollouts[0].status = "completed"
    batches.put_state(batch)
    changed, meter = store.objects.metered(read)
    assert changed is not None and changed is not first and meter.read_bytes > 200_000
    assert changed.rollouts[0].status == "completed"
    # Another reader (another stream) starts from nothing.
    other, meter = store.objects.metered(batches.state_reader("o", "batch_x"))
    assert other is not None and meter.read_bytes > 200_000
    assert batches.state_reader("o", "batch_gone")() is None


def _chat_lines(count: int) -> bytes:
    return b"".join(
        orjson.dumps(
            {
                "custom_id": f"r{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
            }
        )
        + b"\n"
        for i in range(count)
    )


def test_polling_files_and_batches_is_held_to_the_same_read_budget(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    """The Files and Batch APIs' reads (a file, its content, the lists, a batch) cost the
    key's read budget as the jobs' reads do: a key downloading a file in a loop gets 429
    ``read_rate_limited``, its other reads of files and batches too, and another key's go
    on."""
    keys = tenants("mallory", "alice")
    mallory, alice = keys.headers("mallory"), keys.headers("alice")
    with jobs_stack(
        broker, s3, model, tmp_path, auth=keys.auth, jobs={"read_units_per_minute": 600}
    ) as stack:  # no worker: the batch stays in progress
        files = f"{stack.base}/v1/files"
        # 2,000 lines of ~150 bytes: some 300 KB, about 40 units a download.
        body = {"purpose": "batch"}
        upload = {"file": ("in.jsonl", _chat_lines(2000))}
        created = httpx.post(files, data=body, files=upload, headers=mallory, timeout=60)
        assert created.status_code == 200, created.text
        file_id = created.json()["id"]
        batch = httpx.post(
            f"{stack.base}/v1/batches",
            json={
                "input_file_id": file_id,
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
            headers=mallory,
            timeout=60,
        )
        assert batch.status_code == 200, batch.text
        theirs = httpx.post(files, data=body, files=upload, headers=alice, timeout=60)
        assert theirs.status_code == 200, theirs.text

        refused: httpx.Response | None = None
        for n in range(200):  # noqa: B007 (n is read after the loop)
            resp = httpx.get(f"{files}/{file_id}/content", headers=mallory, timeout=60)
            if resp.status_code == 429:
                refused = resp
                break
            assert resp.status_code == 200 and len(resp.content) > 250_000, resp.text
        assert refused is not None, "200 downloads of 300 KB, none refused"
        assert n <= 40, f"refused after {n} downloads"
        assert refused.json()["error"]["code"] == "read_rate_limited"
        assert int(refused.headers["retry-after"]) >= 1

        # Its other reads of files and batches wait on the same budget: right after a
        # download it could afford again (the bucket refills 10 units a second; the
        # download costs some 40), each is refused.
        def download() -> bool:
            got = httpx.get(f"{files}/{file_id}/content", headers=mallory, timeout=60)
            return got.status_code == 200

        for path in (
            "/v1/files",
            f"/v1/files/{file_id}",
            "/v1/batches",
            f"/v1/batches/{batch.json()['id']}",
        ):
            eventually(download, 30, 0.5, what="a download allowed again")
            got = httpx.get(f"{stack.base}{path}", headers=mallory)
            assert got.status_code == 429, (path, got.status_code, got.text)
            assert got.json()["error"]["code"] == "read_rate_limited", path
        # The other key's are not touched.
        their_id = theirs.json()["id"]
        assert httpx.get(f"{files}/{their_id}/content", headers=alice).status_code == 200
        assert httpx.get(files, headers=alice).status_code == 200
        assert httpx.get(f"{stack.base}/v1/batches", headers=alice).status_code == 200


def test_one_keys_parallel_reads_are_bounded_in_flight_and_another_keys_go_on(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    """Attacker's test (issue 50): a read is charged once it has run, so parallel costly
    reads (lists of 10,000 files) were all admitted before any was charged, each holding
    one of the storage threads every tenant's reads share. A key now has at most
    jobs.max_reads_in_flight_per_key reads running; past it a 429, and another key's
    reads go on."""
    keys = tenants("mallory", "alice")
    mallory, alice = keys.headers("mallory"), keys.headers("alice")
    with jobs_stack(broker, s3, model, tmp_path, auth=keys.auth) as stack:  # 4 in flight
        files = f"{stack.base}/v1/files"
        for _ in range(20):  # a list of them reads each one's record: some 20 store calls
            upload = {"file": ("in.jsonl", _chat_lines(2))}
            created = httpx.post(
                files, data={"purpose": "batch"}, files=upload, headers=mallory, timeout=60
            )
            assert created.status_code == 200, created.text
        content = f"{files}?limit=10000"

        async def flood() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=60) as client:
                reads = [client.get(content, headers=mallory) for _ in range(32)]
                theirs = client.get(files, headers=alice)
                return list(await asyncio.gather(theirs, *reads))

        theirs, *answers = asyncio.run(flood())
        assert theirs.status_code == 200, theirs.text
        codes = sorted({r.status_code for r in answers})
        assert codes == [200, 429], codes
        refused = [r for r in answers if r.status_code == 429]
        assert {r.json()["error"]["code"] for r in refused} == {"too_many_concurrent_reads"}
        # The key's reads are served again once its own have finished.
        assert httpx.get(content, headers=mallory, timeout=60).status_code == 200
