"""An OpenAI batch's objects, beside the jobs' (each key's under its own owner)::

    batchapi/{owner}/{batch_id}/batch.json    the batch object (conditional writes)
    batchapi/{owner}/{batch_id}/plan.json     its chunks: [start, end, first line, lines]
    batchapi/{owner}/{batch_id}/chunks/{k}    chunk k's answers, written once (the fence)
    batchapi/{owner}/{batch_id}/done/{k}-...  chunk k's counts, in the key's name
    batchapi/{owner}/{batch_id}/resent/{k}-{n}   the sweep's n-th re-send of chunk k (once)
    batchapi/{owner}/index/{batch_id}         the owner's batches, for listing (one LIST)
    batchapi/{owner}/active/{batch_id}-{lines}-{tokens}   while the batch is not final
    batchapi-open/{owner}/{batch_id}          likewise: the sweep's list of every owner's
                                              batches not final (tiergate.jobs.lines.sweep)

A chunk's answers are written with ``If-None-Match: *``: however many workers ran it (a
redelivery after a crash, a rebalance), the first write is the chunk's answer and every
later one is dropped, so each input line has exactly one answer. The counts sit in a key's
name so that one LIST gives a batch's progress and an owner's enqueued lines and tokens.
Batch ids sort by creation time, as file ids do.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

import orjson

from tiergate.jobs.state.store import JobStore
from tiergate.protocol.openaibatch import FINAL, ChunkMessage

# An active batch's marker ends with its lines and its estimated tokens.
_ACTIVE_MARKER = re.compile(r"-(\d+)-(-?\d+)$")


def new_batch_id(now: float | None = None) -> str:
    millis = int((time.time() if now is None else now) * 1000)
    return f"batch_{millis:012x}{uuid.uuid4().hex[:20]}"


def chunk_message(
    owner: str, batch: dict[str, Any], plan: list[list[int]], index: int
) -> ChunkMessage:
    """Chunk ``index`` of ``batch`` (its record on the batch topic), from the batch's plan:
    what the gateway sends at creation and the sweep sends again."""
    start, end, first_line, lines = plan[index]
    return ChunkMessage(
        id=f"{batch['id']}/{index}",
        owner=owner,
        batch_id=batch["id"],
        chunk=index,
        input_file_id=batch["input_file_id"],
        endpoint=batch["endpoint"],
        start=start,
        end=end,
        first_line=first_line,
        expires_at=batch["expires_at"],
        lines=lines,
    )


@dataclass(frozen=True, slots=True)
class ChunkCounts:
    """What one chunk's answers hold: lines answered, failed, skipped (cancelled or
    expired before they ran), and the tokens the gateway counted."""

    completed: int
    failed: int
    skipped: int
    input_tokens: int
    output_tokens: int

    def name(self, chunk: int) -> str:
        return (
            f"{chunk:06d}-{self.completed}-{self.failed}-{self.skipped}-"
            f"{self.input_tokens}-{self.output_tokens}"
        )

    @classmethod
    def parse(cls, name: str) -> tuple[int, ChunkCounts]:
        chunk, *counts = (int(part) for part in name.split("-"))
        return chunk, cls(*counts)


class LineBatchStore:
    def __init__(self, store: JobStore) -> None:
        self.objects = store.objects
        self._root = store.prefixed("batchapi/")
        self._open = store.prefixed("batchapi-open/")

    def _key(self, owner: str, batch_id: str, name: str) -> str:
        return f"{self._root}{owner}/{batch_id}/{name}"

    # -- the batch object ---------------------------------------------------------------

    def create(self, owner: str, batch: dict[str, Any], plan: list[list[int]], tokens: int) -> None:
        """The plan, the markers, then the batch object (it exists from then on): a gateway
        that dies part way leaves markers without a batch, which the sweep removes."""
        batch_id = str(batch["id"])
        self.objects.put(self._key(owner, batch_id, "plan.json"), orjson.dumps(plan))
        self.objects.put(f"{self._root}{owner}/index/{batch_id}", b"")
        if batch["status"] == "failed":  # refused at create: counted a day (failed_since)
            self.objects.put(f"{self._root}{owner}/failed/{batch_id}", b"")
        else:
            lines = int(batch["request_counts"]["total"])
            self.objects.put(f"{self._open}{owner}/{batch_id}", b"")
            self.objects.put(self._active_key(owner, batch_id, lines, tokens), b"")
        self.objects.put_once(self._key(owner, batch_id, "batch.json"), orjson.dumps(batch))

    def get(self, owner: str, batch_id: str) -> tuple[dict[str, Any], str] | None:
        """The batch object and its ETag, or None."""
        got = self.objects.get_tagged(self._key(owner, batch_id, "batch.json"))
        if got is None:
            return None
        body, etag = got
        batch: dict[str, Any] = orjson.loads(body)
        return batch, etag

    def update(self, owner: str, batch: dict[str, Any], etag: str) -> bool:
        """Write ``batch`` if it still has ``etag``; False when another writer was first."""
        key = self._key(owner, str(batch["id"]), "batch.json")
        return self.objects.put_if(key, orjson.dumps(batch), etag)

    def plan(self, owner: str, batch_id: str) -> list[list[int]]:
        raw = self.objects.get(self._key(owner, batch_id, "plan.json"))
        return [] if raw is None else list(orjson.loads(raw))

    def discard(self, owner: str, batch_id: str) -> None:
        """A batch whose chunks never reached the broker: as if it had not been made."""
        self.objects.delete(self._key(owner, batch_id, "batch.json"))
        self.objects.delete(f"{self._root}{owner}/index/{batch_id}")
        self.settle(owner, batch_id)

    def ids(self, owner: str) -> list[str]:
        """The owner's batch ids, oldest first (the index alone: not every chunk's keys).
        An id whose create died before its batch object has none (readers skip it)."""
        root = f"{self._root}{owner}/index/"
        return [key.removeprefix(root) for key in self.objects.keys(root)]

    def failed_since(self, owner: str, since: float) -> int:
        """How many batches of the owner failed at create since ``since`` (epoch s): one
        LIST from that time on (batch ids start with their creation time)."""
        root = f"{self._root}{owner}/failed/"
        start = root + new_batch_id(since)[: len("batch_") + 12]
        return len(self.objects.keys(root, start_after=start))

    def prune(self, owner: str, before: float, limit: int) -> int:
        """Remove up to ``limit`` of the owner's final batches created before ``before``
        (epoch s): the batch object, its plan, markers and index entry (not its files).
        A batch not yet final stays. Returns how many went."""
        root = f"{self._root}{owner}/index/"
        cutoff = new_batch_id(before)[: len("batch_") + 12]
        removed = 0
        # Listed with a bound too: old batches not yet final are looked at, not removed.
        for key in self.objects.keys(root, limit=4 * limit):
            batch_id = key.removeprefix(root)
            if batch_id[: len(cutoff)] >= cutoff or removed >= limit:
                break  # ids are in time order: the rest are newer
            got = self.get(owner, batch_id)
            if got is not None and got[0]["status"] not in FINAL:
                continue
            # Kept from when it ended, not only from when it was made.
            ended = max(float(got[0].get(f"{status}_at") or 0) for status in FINAL) if got else 0.0
            if ended >= before:
                continue
            for kind in ("done/", "resent/", "chunks/"):
                for part in self.objects.keys(self._key(owner, batch_id, kind)):
                    self.objects.delete(part)
            self.objects.delete(self._key(owner, batch_id, "plan.json"))
            self.objects.delete(self._key(owner, batch_id, "batch.json"))
            self.objects.delete(f"{self._root}{owner}/failed/{batch_id}")
            self.objects.delete(key)
            self.settle(owner, batch_id)
            removed += 1
        return removed

    # -- the owner's enqueued work ------------------------------------------------------

    def _active_key(self, owner: str, batch_id: str, lines: int, tokens: int) -> str:
        return f"{self._root}{owner}/active/{batch_id}-{lines}-{tokens}"

    def enqueued(self, owner: str) -> tuple[int, int, int]:
        """(batches, lines, tokens) of the owner's batches not yet final. A marker whose
        figures cannot be read (one an older gateway wrote from a negative estimate,
        ``<id>-1--999``) counts as a batch of one line and no tokens: it never makes the
        owner's every later create fail."""
        root = f"{self._root}{owner}/active/"
        batches = lines = tokens = 0
        for key in self.objects.keys(root):
            figures = _ACTIVE_MARKER.search(key.removeprefix(root))
            count, estimate = (int(figures[1]), int(figures[2])) if figures else (1, 0)
            batches, lines, tokens = batches + 1, lines + count, tokens + max(0, estimate)
        return batches, lines, tokens

    def settle(self, owner: str, batch_id: str) -> None:
        """The batch is final: it no longer counts as enqueued, nor is it swept."""
        for key in self.objects.keys(f"{self._root}{owner}/active/{batch_id}-"):
            self.objects.delete(key)
        self.objects.delete(f"{self._open}{owner}/{batch_id}")

    def open_batches(self) -> list[tuple[str, str]]:
        """(owner, batch id) of every owner's batches not yet settled (one LIST)."""
        found = []
        for key in self.objects.keys(self._open):
            owner, _, batch_id = key.removeprefix(self._open).rpartition("/")
            found.append((owner, batch_id))
        return found

    # -- chunks -------------------------------------------------------------------------

    def put_chunk(self, owner: str, batch_id: str, chunk: int, body: bytes) -> bool:
        """Chunk ``chunk``'s answers, if none were written yet (the fence)."""
        return self.objects.put_once(self._key(owner, batch_id, f"chunks/{chunk:06d}"), body)

    def chunk(self, owner: str, batch_id: str, chunk: int) -> bytes | None:
        return self.objects.get(self._key(owner, batch_id, f"chunks/{chunk:06d}"))

    def drop_answers(self, owner: str, batch_id: str) -> None:
        """The chunks' answers of a final batch: its output and error files hold them now,
        and an owner who deletes those must find the answers gone, not kept beside them."""
        for key in self.objects.keys(self._key(owner, batch_id, "chunks/")):
            self.objects.delete(key)

    def mark_done(self, owner: str, batch_id: str, chunk: int, counts: ChunkCounts) -> None:
        self.objects.put(self._key(owner, batch_id, f"done/{counts.name(chunk)}"), b"")

    def resends(self, owner: str, batch_id: str) -> dict[int, int]:
        """How many times the sweep sent each chunk again (one LIST)."""
        root = self._key(owner, batch_id, "resent/")
        found: dict[int, int] = {}
        for key in self.objects.keys(root):
            chunk, count = (int(part) for part in key.removeprefix(root).split("-"))
            found[chunk] = max(found.get(chunk, 0), count)
        return found

    def claim_resend(self, owner: str, batch_id: str, chunk: int, count: int) -> bool:
        """Whether this caller is the one to send chunk ``chunk`` for the ``count``-th time."""
        key = self._key(owner, batch_id, f"resent/{chunk:06d}-{count}")
        return self.objects.put_once(key, b"")

    def progress(self, owner: str, batch_id: str) -> dict[int, ChunkCounts]:
        """The counts of every chunk answered so far, by chunk (one LIST)."""
        root = self._key(owner, batch_id, "done/")
        return dict(ChunkCounts.parse(key.removeprefix(root)) for key in self.objects.keys(root))
