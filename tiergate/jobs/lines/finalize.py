"""When an OpenAI batch is final, and its output and error files.

A batch's progress is its chunks' counts (one LIST). It becomes final when every chunk is
answered (``completed``), when it was cancelled and its chunks in flight have ended or
``batch_api.cancel_grace_seconds`` passed (``cancelled``), or when its window ran out
(``expired``); the last two keep what finished. Whoever reads the batch then (a gateway
replica answering ``GET``) finalizes it in two conditional writes: ``finalizing`` with the
chunks it will use (the first writer's snapshot is the one every finalizer uses), then the
files, written under ids derived from the batch's (the same however many finalizers write
them), then the final status. Lines are written in input order. The chunks' answers are
then removed: the files are the one copy, and deleting them deletes the answers.

Every chunk is answered before it is counted, so a counted chunk whose answers are gone
means another finalizer got there first and removed them: this one stops, writes nothing,
and reads the final batch. Without that, a finalizer overtaken part way through its reads
stored files missing the chunks it read too late, over the whole ones and under the same
ids (seen in CI: 120 lines counted, 88 in the output file). It looks again just before it
stores, so that it does not bring back files an owner deleted the moment the batch ended.

The files are assembled in the temporary directory first (whole outputs, up to a batch's
lines times their answers): a gateway replica gives its finalizer a ``room`` that holds one
of the slots its spooled transfers share (tiergate.gateway.jobs.uploads.SpoolSlots), so
that its ``/tmp`` stays within the bound the chart sizes it by however many batches end at
once. Without a slot the batch stays ``finalizing`` for this read; the next read, or the
sweep, finishes it.
"""

from __future__ import annotations

import contextlib
import hashlib
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import orjson

from tiergate.jobs.lines.store import ChunkCounts, LineBatchStore
from tiergate.jobs.state.files import FileStore
from tiergate.jobsettings import BatchApiSettings
from tiergate.protocol.openaibatch import FINAL


def output_file_id(batch: dict[str, Any], kind: str) -> str:
    millis = int(batch["created_at"]) * 1000
    digest = hashlib.sha256(f"{batch['id']}/{kind}".encode()).hexdigest()[:20]
    return f"file-{millis:012x}{digest}"


def public(batch: dict[str, Any]) -> dict[str, Any]:
    """The batch object as OpenAI's clients read it (tiergate's own fields left out)."""
    return {k: v for k, v in batch.items() if not k.startswith("_")}


def _tally(batch: dict[str, Any], progress: dict[int, ChunkCounts]) -> None:
    counts = list(progress.values())
    total = int(batch["request_counts"]["total"])
    batch["request_counts"] = {
        "total": total,
        "completed": sum(c.completed for c in counts),
        "failed": sum(c.failed for c in counts),
    }
    inputs, outputs = sum(c.input_tokens for c in counts), sum(c.output_tokens for c in counts)
    batch["usage"] = {
        "input_tokens": inputs,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": outputs,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": inputs + outputs,
    }


# Room in the temporary directory for one owner's files: entered, it says whether there is.
Room = Callable[[str], AbstractContextManager[bool]]


@contextlib.contextmanager
def always_room(owner: str) -> Iterator[bool]:
    """The room of a process whose temporary directory no one else shares (the sweep)."""
    yield True


class Finalizer:
    def __init__(
        self,
        lines: LineBatchStore,
        files: FileStore,
        settings: BatchApiSettings,
        room: Room = always_room,
    ) -> None:
        self._lines = lines
        self._files = files
        self._settings = settings
        self._room = room

    def current(self, owner: str, batch_id: str) -> dict[str, Any] | None:
        """The batch as it stands now, finalized first if its time has come (storage
        calls: run it in a thread)."""
        for _ in range(5):  # another finalizer may be writing at the same moment
            got = self._lines.get(owner, batch_id)
            if got is None:
                return None
            batch, etag = got
            if batch["status"] in FINAL:
                return batch
            settled = self._step(owner, batch, etag)
            if settled is not None:
                return settled
        got = self._lines.get(owner, batch_id)
        return None if got is None else got[0]

    def _step(self, owner: str, batch: dict[str, Any], etag: str) -> dict[str, Any] | None:
        """The batch after one step, or None when a write lost to another writer."""
        now = time.time()
        progress = self._lines.progress(owner, batch["id"])
        _tally(batch, progress)
        status = batch["status"]
        if status == "finalizing":
            return self._finish(owner, batch, etag, now)
        chunks = int(batch["_chunks"])
        if len(progress) >= chunks:
            target = "cancelled" if status == "cancelling" else "completed"
        elif status == "cancelling" and (
            now - float(batch["cancelling_at"] or now) >= self._settings.cancel_grace_seconds
        ):
            target = "cancelled"
        elif now >= float(batch["expires_at"]):
            target = "expired"
        else:
            return batch  # still running: the counts so far
        batch["status"] = "finalizing"
        batch["finalizing_at"] = int(now)
        batch["_final"] = {"target": target, "chunks": sorted(progress)}
        if not self._lines.update(owner, batch, etag):
            return None
        got = self._lines.get(owner, batch["id"])
        if got is None:
            return None
        return self._finish(owner, got[0], got[1], now)

    def _finish(
        self, owner: str, batch: dict[str, Any], etag: str, now: float
    ) -> dict[str, Any] | None:
        with self._room(owner) as room:
            if not room:
                return batch  # finalizing still: a later read, or the sweep, finishes it
            return self._write_files(owner, batch, etag, now)

    def _still(self, owner: str, batch_id: str, etag: str) -> bool:
        """Whether the batch object is still the one this finalizer read (no one else
        has finished it meanwhile)."""
        got = self._lines.get(owner, batch_id)
        return got is not None and got[1] == etag

    def _write_files(
        self, owner: str, batch: dict[str, Any], etag: str, now: float
    ) -> dict[str, Any] | None:
        final = batch["_final"]
        snapshot = {int(k) for k in final["chunks"]}
        progress = {
            k: v for k, v in self._lines.progress(owner, batch["id"]).items() if k in snapshot
        }
        _tally(batch, progress)
        with tempfile.TemporaryDirectory(prefix="tiergate-batch-") as tmp:
            out_path, err_path = Path(tmp) / "output", Path(tmp) / "errors"
            outputs = errors = 0
            with out_path.open("wb") as out, err_path.open("wb") as err:
                for chunk in sorted(snapshot):
                    body = self._lines.chunk(owner, batch["id"], chunk)
                    if body is None:
                        return None  # another finalizer finished and removed the answers
                    for raw in body.splitlines():
                        entry = orjson.loads(raw)
                        if entry["t"] == "o":
                            out.write(orjson.dumps(entry["l"]) + b"\n")
                            outputs += 1
                        elif entry["t"] == "e":
                            err.write(orjson.dumps(entry["l"]) + b"\n")
                            errors += 1
            if not self._still(owner, batch["id"], etag):
                return None
            for kind, path, count, field in (
                ("output", out_path, outputs, "output_file_id"),
                ("errors", err_path, errors, "error_file_id"),
            ):
                if count == 0:
                    batch[field] = None
                    continue
                file_id = output_file_id(batch, kind)
                meta = {
                    "id": file_id,
                    "object": "file",
                    "bytes": path.stat().st_size,
                    "created_at": int(now),
                    "filename": f"{batch['id']}_{kind}.jsonl",
                    "purpose": "batch_output",
                    "status": "processed",
                    "expires_at": None,
                    "status_details": None,
                }
                self._files.put(owner, meta, path)
                batch[field] = file_id
        target = str(final["target"])
        batch["status"] = target
        batch[f"{target}_at"] = int(now)
        if not self._lines.update(owner, batch, etag):
            return None
        self._lines.settle(owner, batch["id"])
        self._lines.drop_answers(owner, batch["id"])
        return batch
