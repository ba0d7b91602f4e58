"""The batch sweep: no accepted OpenAI batch waits out its window for want of a record.

A batch is recorded (its plan, its markers, then the batch object) before its chunks are
sent to the broker. A gateway that dies in between, or a broker that loses acknowledged
records (an in-memory broker restarting), leaves chunks no worker will ever take, and the
batch would sit ``in_progress`` for 24 hours holding its key's enqueued quota. So every
worker sweeps the open batches now and then, as the jobs' sweep does
(tiergate.jobs.state.sweep), and decides from the broker, not from the batch's age: a chunk
not yet answered whose record is not at or past the batch group's committed position (the
backlog and the records being run, :func:`tiergate.queue.lag.keys_ahead`) for
``requeue_after_seconds`` of this worker's own watching is sent again. The first worker to
claim the re-send (a write-once marker per re-send) sends it; the others start watching the
new record. A chunk sent again is never answered twice: its answers are written once.

The sweep also finalizes the batches no client reads (every chunk answered, the window
over, a cancel's grace past), so that a batch ends, writes its files and gives back its
key's quota on time; it settles a final batch whose markers a crash left behind, and drops
the markers of a batch whose gateway died before writing the batch object (after
``requeue_after_seconds`` of watching: nothing was accepted). A sweep that cannot read the
whole backlog acts on nothing.

Its cost, per sweep per worker: one LIST of the open batches, then per open batch a GET
and three LISTs (the batch, its answered chunks, its re-sends), and one read of the batch
topic's backlog.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from tiergate.jobs.lines.finalize import Finalizer
from tiergate.jobs.lines.metrics import LineMetrics
from tiergate.jobs.lines.store import LineBatchStore, chunk_message
from tiergate.jobs.state.files import FileStore
from tiergate.jobs.state.store import JobStore
from tiergate.jobs.state.sweep import Sweeper
from tiergate.jobsettings import JobsSettings
from tiergate.protocol.openaibatch import FINAL
from tiergate.queue.lag import backlog_reader
from tiergate.queue.pipeline import JobQueue

log = logging.getLogger("tiergate.lines.sweep")


class ChunkSweeper:
    """One worker's batch sweeps; it remembers since when each chunk has been missing."""

    def __init__(
        self,
        lines: LineBatchStore,
        finalizer: Finalizer,
        queue: JobQueue,
        settings: JobsSettings,
        clock: Callable[[], float] = time.monotonic,
        backlog: Callable[[], set[str]] | None = None,
        metrics: LineMetrics | None = None,
    ) -> None:
        self._lines = lines
        self._metrics = metrics
        self._finalizer = finalizer
        self._queue = queue
        self._requeue_after = settings.requeue_after_seconds
        self._clock = clock
        kafka = settings.kafka
        self._backlog = backlog or backlog_reader(kafka, kafka.batch_group, kafka.batch_topic)
        # batch id (no batch object yet) or chunk id -> (first seen missing, re-sends seen)
        self._missing: dict[str, tuple[float, int]] = {}

    @classmethod
    def of(
        cls,
        store: JobStore,
        queue: JobQueue,
        settings: JobsSettings,
        metrics: LineMetrics | None = None,
    ) -> ChunkSweeper:
        """A worker's batch sweeper over the jobs' store and queue."""
        lines = LineBatchStore(store)
        finalizer = Finalizer(lines, FileStore(store), settings.batch_api)
        return cls(lines, finalizer, queue, settings, metrics=metrics)

    def run(self) -> int:
        """One pass; returns how many chunks it sent again."""
        batches = self._lines.open_batches()
        if not batches:
            self._missing.clear()
            return 0
        ahead = self._backlog()  # raises when the backlog cannot be read whole
        now = self._clock()
        watched: set[str] = set()
        sent = 0
        for owner, batch_id in batches:
            batch = self._finalizer.current(owner, batch_id)
            if batch is None:
                # Markers without a batch: one being created, or whose gateway died.
                watched.add(batch_id)
                since, _ = self._missing.setdefault(batch_id, (now, 0))
                if now - since >= self._requeue_after:
                    self._lines.discard(owner, batch_id)
                continue
            if batch["status"] in FINAL:
                self._lines.settle(owner, batch_id)  # a crash after its final write
                continue
            if batch["status"] != "in_progress":
                continue  # cancelling or finalizing: the finalizer ends it
            plan = self._lines.plan(owner, batch_id)
            answered = self._lines.progress(owner, batch_id)
            resends = self._lines.resends(owner, batch_id)
            for index in range(len(plan)):
                chunk_id = f"{batch_id}/{index}"
                if index in answered or chunk_id in ahead:
                    continue
                watched.add(chunk_id)
                count = resends.get(index, 0)
                since, seen = self._missing.get(chunk_id, (now, count))
                if seen != count:
                    since = now  # sent again by another worker since: watch the new record
                self._missing[chunk_id] = (since, count)
                if now - since < self._requeue_after:
                    continue
                if not self._lines.claim_resend(owner, batch_id, index, count + 1):
                    continue  # another worker sends it; its marker is seen next pass
                self._queue.send_chunk(chunk_message(owner, batch, plan, index))
                log.warning(
                    "batch chunk %s: its record was not in the topic for %.0fs: sent again",
                    chunk_id,
                    self._requeue_after,
                )
                self._missing[chunk_id] = (now, count + 1)
                sent += 1
                if self._metrics is not None:
                    self._metrics.chunks_resent_total.inc()
        for key in set(self._missing) - watched:
            del self._missing[key]
        return sent


def worker_sweeps(
    store: JobStore, queue: JobQueue, settings: JobsSettings, metrics: LineMetrics | None = None
) -> list[Callable[[], int]]:
    """A worker's sweeps, in order: the jobs' lost messages, then the OpenAI batches' lost
    chunks and unread ends."""
    return [
        Sweeper(store, queue, settings).run,
        ChunkSweeper.of(store, queue, settings, metrics).run,
    ]
