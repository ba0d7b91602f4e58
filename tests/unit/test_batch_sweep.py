"""The OpenAI batches' sweep (tiergate.jobs.lines.sweep) decides from the broker's backlog
and its own clock: a chunk neither answered nor waiting is sent again after
``requeue_after_seconds``, by one worker only; markers of a create that died are dropped.
Over FakeObjects (an in-memory object store with S3's conditional writes, a fake) and a
fake queue; the same sweep against Tansu and SeaweedFS: tests/jobs/test_batch_faults.py."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from tiergate.jobs.lines.finalize import Finalizer
from tiergate.jobs.lines.store import ChunkCounts, LineBatchStore
from tiergate.jobs.lines.sweep import ChunkSweeper
from tiergate.jobsettings import BatchApiSettings, JobsSettings
from tiergate.protocol.openaibatch import ChunkMessage

REQUEUE = 10.0


class FakeObjects:
    """A fake object store: keys in a dict, ETags counted, conditional writes as S3's."""

    def __init__(self) -> None:
        self.data: dict[str, tuple[bytes, str]] = {}
        self._tags = 0

    def put(self, key: str, body: bytes, **_: Any) -> None:
        self._tags += 1
        self.data[key] = (body, str(self._tags))

    def put_if(self, key: str, body: bytes, etag: str | None, **_: Any) -> bool:
        current = self.data.get(key)
        if (etag is None and current is not None) or (
            etag is not None and (current is None or current[1] != etag)
        ):
            return False
        self.put(key, body)
        return True

    def put_once(self, key: str, body: bytes, **_: Any) -> bool:
        return self.put_if(key, body, None)

    def get(self, key: str) -> bytes | None:
        got = self.data.get(key)
        return None if got is None else got[0]

    def get_tagged(self, key: str) -> tuple[bytes, str] | None:
        return self.data.get(key)

    def delete(self, key: str) -> None:
        self.data.pop(key, None)

    def keys(self, prefix: str, start_after: str = "", limit: int | None = None) -> list[str]:
        return sorted(k for k in self.data if k.startswith(prefix) and k > start_after)


class FakeQueue:
    def __init__(self) -> None:
        self.sent: list[ChunkMessage] = []

    def send_chunk(self, message: ChunkMessage) -> None:
        self.sent.append(message)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _batch(lines: LineBatchStore, chunks: int = 3, owner: str = "alice") -> dict[str, Any]:
    now = int(time.time())
    batch = {
        "id": "batch_" + "0" * 32,
        "object": "batch",
        "endpoint": "/v1/chat/completions",
        "input_file_id": "file-x",
        "status": "in_progress",
        "created_at": now,
        "expires_at": now + 86400,
        "request_counts": {"total": chunks * 2, "completed": 0, "failed": 0},
        "_chunks": chunks,
    }
    plan = [[i * 100, (i + 1) * 100, i * 2 + 1, 2] for i in range(chunks)]
    lines.create(owner, batch, plan, tokens=10)
    return batch


def _sweeper(
    lines: LineBatchStore, queue: FakeQueue, clock: Clock, backlog: set[str]
) -> ChunkSweeper:
    settings = JobsSettings(requeue_after_seconds=REQUEUE)
    finalizer = Finalizer(lines, SimpleNamespace(), BatchApiSettings())  # type: ignore[arg-type]
    return ChunkSweeper(
        lines,
        finalizer,
        queue,
        settings,
        clock=clock,
        backlog=lambda: backlog,  # type: ignore[arg-type]
    )


def _lines() -> LineBatchStore:
    return LineBatchStore(SimpleNamespace(objects=FakeObjects(), prefixed=lambda r: f"p/{r}"))  # type: ignore[arg-type]


def test_a_chunk_neither_answered_nor_waiting_is_sent_again_once_after_the_wait() -> None:
    lines, queue, clock = _lines(), FakeQueue(), Clock()
    batch = _batch(lines)
    lines.mark_done("alice", batch["id"], 0, ChunkCounts(2, 0, 0, 5, 5))  # answered
    backlog = {f"{batch['id']}/1"}  # waiting its turn, however long
    sweeper = _sweeper(lines, queue, clock, backlog)
    assert sweeper.run() == 0  # chunk 2 is missing from now on
    clock.now += REQUEUE - 1
    assert sweeper.run() == 0 and queue.sent == []
    clock.now += 1
    assert sweeper.run() == 1
    (sent,) = queue.sent
    assert (sent.id, sent.chunk, sent.start, sent.end, sent.first_line) == (
        f"{batch['id']}/2",
        2,
        200,
        300,
        5,
    )
    assert sent.owner == "alice" and sent.expires_at == batch["expires_at"]
    clock.now += 1
    assert sweeper.run() == 0  # the new record is watched afresh


def test_two_workers_sweeping_send_a_missing_chunk_once() -> None:
    lines, queue, clock = _lines(), FakeQueue(), Clock()
    _batch(lines, chunks=1)
    first, second = (_sweeper(lines, queue, clock, set()) for _ in range(2))
    first.run(), second.run()
    clock.now += REQUEUE
    assert first.run() + second.run() == 1 and len(queue.sent) == 1
    # The second saw the first's re-send: it waits a whole interval for the new record.
    clock.now += REQUEUE - 1
    assert second.run() == 0
    clock.now += 1
    assert second.run() == 1 and len(queue.sent) == 2


def test_markers_without_a_batch_object_are_dropped_after_the_wait() -> None:
    lines, queue, clock = _lines(), FakeQueue(), Clock()
    batch = _batch(lines)
    objects = lines.objects
    del objects.data[f"p/batchapi/alice/{batch['id']}/batch.json"]  # the create died here
    sweeper = _sweeper(lines, queue, clock, set())
    sweeper.run()
    clock.now += REQUEUE - 1
    sweeper.run()
    assert lines.enqueued("alice") == (1, 6, 10)  # maybe a create still under way
    clock.now += 1
    sweeper.run()
    assert lines.enqueued("alice") == (0, 0, 0) and lines.open_batches() == []
    assert lines.ids("alice") == [] and queue.sent == []


def test_a_final_batch_whose_markers_a_crash_left_is_settled() -> None:
    lines, queue, clock = _lines(), FakeQueue(), Clock()
    batch = _batch(lines)
    got = lines.get("alice", batch["id"])
    assert got is not None
    stored, etag = got
    stored["status"] = "cancelled"
    assert lines.update("alice", stored, etag)  # then the process died before settle()
    _sweeper(lines, queue, clock, set()).run()
    assert lines.enqueued("alice") == (0, 0, 0) and lines.open_batches() == []
