"""No job waits behind a running one while a slot anywhere is free (issue 21, item 1).

A partition belongs to one worker of the group; a worker whose slots are all busy pauses
its partitions, so the jobs behind its running ones would wait for one of its own slots
although another worker sits idle. A worker with a free slot whose own partitions have
given it nothing for ``steal_after_seconds`` therefore looks at the first records past
the group's committed position on every partition (:class:`tiergate.queue.lag.AheadReader`,
one consumer kept between looks),
and takes over a job that is still ``queued`` in a partition it does not own. The run
lease (tiergate.jobs.state.lease) makes that safe: whoever takes the job's lease first runs it,
the other finds it held (or ended) and moves on; the partition's owner commits the record
when it reaches it and finds the job ended. Nothing is committed by the one who took it.

Its cost, only while a worker idles: one read of a few records per partition and a status
read per candidate, every ``steal_after_seconds``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from kafka import TopicPartition
from pydantic import ValidationError

from tiergate.jobs.state.store import JobStore, StorageError
from tiergate.jobsettings import JobsSettings
from tiergate.protocol import JobMessage, JobStatus
from tiergate.queue.lag import AheadReader, LagUnavailable

log = logging.getLogger("tiergate.steal")

# Records looked at per partition: past the owner's running and held ones.
PER_PARTITION = 16
# Status reads per look at most.
MAX_READS = 32
# A job this worker took over is not offered again for this long.
FORGET_AFTER = 120.0


class Stealer:
    """Finds queued jobs in partitions this worker does not own."""

    def __init__(
        self,
        settings: JobsSettings,
        store: JobStore,
        read: Callable[[int], list[tuple[TopicPartition, int, bytes]]] | None = None,
    ) -> None:
        kafka = settings.kafka
        self._store = store
        self._partitions = kafka.partitions
        # One reader for the worker's life: a look every steal_after_seconds while it idles.
        self._reader: AheadReader | None = None
        if read is None:
            self._reader = AheadReader(
                kafka.bootstrap_servers,
                kafka.group,
                kafka.topic,
                client_options=kafka.client_options(),
            )
            read = self._reader.read
        self._read = read
        self._taken: dict[str, float] = {}

    def close(self) -> None:
        """Close the reader's consumer (the worker is stopping)."""
        if self._reader is not None:
            self._reader.close()

    def candidates(
        self, wanted: int, owned: set[TopicPartition]
    ) -> list[tuple[TopicPartition, int, bytes]]:
        """Up to ``wanted`` records of queued jobs in partitions not ``owned`` here (oldest
        first per partition, partitions in turn)."""
        if len(owned) >= self._partitions:
            return []  # every partition is this worker's: nothing waits elsewhere
        now = time.monotonic()
        self._taken = {k: t for k, t in self._taken.items() if now - t < FORGET_AFTER}
        try:
            records = self._read(PER_PARTITION)
        except LagUnavailable as exc:
            log.debug("no look at the backlog: %s", exc)
            return []
        chosen: list[tuple[TopicPartition, int, bytes]] = []
        reads = 0
        for tp, offset, value in records:
            if len(chosen) >= wanted or reads >= MAX_READS:
                break
            if tp in owned:
                continue
            try:
                message = JobMessage.model_validate_json(value)
            except ValidationError:
                continue
            if message.id in self._taken or message.resent:
                continue
            reads += 1
            try:
                job = self._store.get(message.id)
            except StorageError:
                return chosen
            if job is None or job.status is not JobStatus.QUEUED or job.error is not None:
                continue
            self._taken[message.id] = now
            chosen.append((tp, offset, value))
        if chosen:
            log.info("taking over %d queued job(s) from busy workers' partitions", len(chosen))
        return chosen
