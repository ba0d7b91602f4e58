"""Two finalizers of one batch at once (two gateway replicas answering ``GET``, or one and
the sweep): the first writes the files, the final status, then removes the chunks' answers.
A second one that read part of the answers before they went, and the rest after, must not
store its partial files over the whole ones under the same file ids (seen in CI: a batch of
120 lines ``completed`` with 120 counted and 88 lines in its output file). Over the
FakeObjects store (a fake, tests/unit/test_batch_sweep.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from tests.unit.test_batch_finalize_room import RecordingFiles
from tests.unit.test_batch_sweep import _batch, _lines
from tiergate.jobs.lines.finalize import Finalizer
from tiergate.jobs.lines.store import ChunkCounts, LineBatchStore
from tiergate.jobsettings import BatchApiSettings


class OvertakenLines(LineBatchStore):
    """The second finalizer's view of the store: before (or after) it reads chunk ``at``,
    ``overtake`` runs (the first finalizer to the end: files, final status, answers
    removed)."""

    def __init__(
        self, lines: LineBatchStore, overtake: Callable[[], None], at: int, after: bool = False
    ) -> None:
        self.__dict__.update(lines.__dict__)
        self._overtake: Callable[[], None] | None = overtake
        self._at, self._after = at, after

    def chunk(self, owner: str, batch_id: str, chunk: int) -> bytes | None:
        if chunk == self._at and not self._after:
            self._run_overtake()
        body = super().chunk(owner, batch_id, chunk)
        if chunk == self._at and self._after:
            self._run_overtake()
        return body

    def _run_overtake(self) -> None:
        overtake, self._overtake = self._overtake, None
        if overtake is not None:
            overtake()


def _answered(chunks: int) -> tuple[LineBatchStore, dict[str, Any]]:
    lines = _lines()
    batch = _batch(lines, chunks=chunks)
    for chunk in range(chunks):
        body = b"".join(
            orjson.dumps({"t": "o", "l": {"custom_id": f"request-{2 * chunk + i}"}}) + b"\n"
            for i in range(2)
        )
        lines.put_chunk("alice", batch["id"], chunk, body)
        lines.mark_done("alice", batch["id"], chunk, ChunkCounts(2, 0, 0, 5, 5))
    return lines, batch


def test_a_finalizer_overtaken_mid_read_leaves_the_whole_output_file() -> None:
    lines, batch = _answered(3)
    files = RecordingFiles()
    first = Finalizer(lines, files, BatchApiSettings())  # type: ignore[arg-type]

    def overtake() -> None:
        done = first.current("alice", batch["id"])
        assert done is not None and done["status"] == "completed"

    second = Finalizer(
        OvertakenLines(lines, overtake, at=2),
        files,  # type: ignore[arg-type]
        BatchApiSettings(),
    )

    done = second.current("alice", batch["id"])

    assert done is not None and done["status"] == "completed"
    assert done["request_counts"] == {"total": 6, "completed": 6, "failed": 0}
    output = files.stored[done["output_file_id"]]
    ids = [orjson.loads(line)["custom_id"] for line in output.splitlines()]
    assert ids == [f"request-{i}" for i in range(6)], "the output file holds every line once"


def test_a_finalizer_overtaken_after_its_reads_does_not_bring_back_a_deleted_file() -> None:
    lines, batch = _answered(2)
    files = RecordingFiles()
    first = Finalizer(lines, files, BatchApiSettings())  # type: ignore[arg-type]
    deleted: list[str] = []

    def overtake_then_delete() -> None:
        done = first.current("alice", batch["id"])
        assert done is not None and done["status"] == "completed"
        files.stored.pop(done["output_file_id"])  # the owner deletes it as soon as it ends
        deleted.append(done["output_file_id"])

    second = Finalizer(
        OvertakenLines(lines, overtake_then_delete, at=1, after=True),
        files,  # type: ignore[arg-type]
        BatchApiSettings(),
    )

    done = second.current("alice", batch["id"])

    assert done is not None and done["status"] == "completed"
    assert deleted == [done["output_file_id"]] and files.stored == {}
