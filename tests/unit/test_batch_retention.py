"""Final batches end (issue 50 item 3): past jobs.batch_api.retention_seconds a final
batch's object, plan, markers and answers go when its owner next creates one (at most
prune_per_create at a time); a batch not yet final stays, and so do newer ones; failed
creates are counted by day. Over FakeObjects (a fake object store, test_batch_sweep.py)."""

from __future__ import annotations

import time

from tests.unit.test_batch_sweep import _lines
from tiergate.jobs.lines.store import ChunkCounts, LineBatchStore, new_batch_id


def _make(lines: LineBatchStore, created: float, status: str, owner: str = "alice") -> str:
    batch_id = new_batch_id(created)
    batch = {
        "id": batch_id,
        "status": status,
        "created_at": int(created),
        "request_counts": {"total": 2, "completed": 0, "failed": 0},
    }
    lines.create(owner, batch, [[0, 10, 1, 2]], tokens=5)
    lines.mark_done(owner, batch_id, 0, ChunkCounts(2, 0, 0, 1, 1))
    lines.put_chunk(owner, batch_id, 0, b"{}\\n")
    return batch_id


def test_final_batches_past_their_retention_go_and_the_rest_stay() -> None:
    lines = _lines()
    now = time.time()
    day = 86400.0
    old_done = _make(lines, now - 40 * day, "completed")
    old_failed = _make(lines, now - 35 * day, "failed")
    old_running = _make(lines, now - 33 * day, "in_progress")
    recent = _make(lines, now - 2 * day, "completed")
    objects = lines.objects.data  # type: ignore[attr-defined]
    before = len(objects)
    assert lines.prune("alice", now - 30 * day, limit=50) == 2
    assert lines.ids("alice") == [old_running, recent]
    assert lines.get("alice", old_done) is None and lines.get("alice", old_failed) is None
    assert not any(old_done in k or old_failed in k for k in objects)
    assert len(objects) < before
    assert lines.get("alice", old_running) is not None  # not final: kept


def test_pruning_is_bounded_per_call_and_counts_failed_creates_by_day() -> None:
    lines = _lines()
    now = time.time()
    olds = [_make(lines, now - 40 * 86400 + i, "failed") for i in range(5)]
    assert lines.failed_since("alice", now - 86400) == 0
    fresh = [_make(lines, now - 60 * i, "failed") for i in range(3)]
    assert lines.failed_since("alice", now - 86400) == 3
    assert lines.failed_since("bob", now - 86400) == 0
    assert lines.prune("alice", now - 30 * 86400, limit=2) == 2
    assert lines.ids("alice") == sorted([*olds[2:], *fresh])
    assert lines.prune("alice", now - 30 * 86400, limit=50) == 3
    assert lines.ids("alice") == sorted(fresh)
