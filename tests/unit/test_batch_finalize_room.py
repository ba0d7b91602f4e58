"""Batch finalization writes whole output files to the temporary directory before storing
them; a gateway replica's /tmp is sized for its spool slots (tiergate.gateway.jobs.uploads
.SpoolSlots), so finalization takes one too. Without a free slot the batch stays
``finalizing`` for that read and nothing is written; a later read finishes it. Over the
FakeObjects store (a fake, tests/unit/test_batch_sweep.py)."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.unit.test_batch_sweep import _batch, _lines
from tiergate.gateway.jobs.uploads import SpoolSlots
from tiergate.jobs.lines.finalize import Finalizer
from tiergate.jobs.lines.store import ChunkCounts
from tiergate.jobsettings import BatchApiSettings, JobsSettings


class RecordingFiles:
    """A fake FileStore: records what was stored, and how many spool files existed when."""

    def __init__(self) -> None:
        self.stored: dict[str, bytes] = {}

    def put(self, owner: str, meta: dict[str, Any], path: Path) -> None:
        self.stored[str(meta["id"])] = path.read_bytes()


def _answered_batch() -> tuple[Any, dict[str, Any]]:
    lines = _lines()
    batch = _batch(lines, chunks=1)
    answer = {"t": "o", "l": {"custom_id": "a", "response": {"status_code": 200}}}
    lines.put_chunk("alice", batch["id"], 0, orjson.dumps(answer) + b"\n")
    lines.mark_done("alice", batch["id"], 0, ChunkCounts(2, 0, 0, 5, 5))
    return lines, batch


def test_finalization_waits_for_a_spool_slot_and_writes_nothing_without_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines, batch = _answered_batch()
    files = RecordingFiles()
    slots = SpoolSlots(JobsSettings(max_concurrent_uploads=1))
    finalizer = Finalizer(lines, files, BatchApiSettings(), room=slots.room)  # type: ignore[arg-type]
    made: list[str] = []
    real = tempfile.TemporaryDirectory

    def counting(*args: Any, **kwargs: Any) -> Any:
        made.append("dir")
        return real(*args, **kwargs)

    monkeypatch.setattr(tempfile, "TemporaryDirectory", counting)

    slots.take("bob", {})  # another key's upload holds the replica's only slot
    held = finalizer.current("alice", batch["id"])
    assert held is not None and held["status"] == "finalizing"
    assert files.stored == {} and made == []

    slots.release("bob")
    done = finalizer.current("alice", batch["id"])
    assert done is not None and done["status"] == "completed"
    assert done["output_file_id"] in files.stored and made == ["dir"]
    # The slot was given back: the replica can take its one slot again.
    slots.take("bob", {})


def test_a_keys_finalizations_count_against_its_own_share_of_slots() -> None:
    slots = SpoolSlots(JobsSettings(max_concurrent_uploads=8, max_concurrent_uploads_per_key=1))
    with slots.room("alice") as first, slots.room("alice") as second, slots.room("bob") as other:
        assert (first, second, other) == (True, False, True)
    with contextlib.ExitStack() as stack:
        assert all(stack.enter_context(slots.room(f"k{i}")) for i in range(8))
        with slots.room("late") as late:
            assert late is False
