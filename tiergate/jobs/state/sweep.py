"""The sweep: no accepted job stays queued forever, whatever happened between the object
store and the broker, and no job is failed for waiting in a long backlog.

A job is recorded in object storage before its message is produced; a gateway that dies
in between, or a broker that loses an acknowledged message (an in-memory broker
restarting), leaves a job ``queued`` with no message. Every worker sweeps the unfinished
jobs now and then, and decides from the broker, not from the job's age (issue 21, item 3):
it reads the keys of every message at or past the group's committed position (the backlog
and the records being run: :func:`tiergate.queue.lag.keys_ahead`). A queued job whose
message is there is waiting its turn, however long that takes. One whose message is not
there for ``requeue_after_seconds`` of this worker's own watching (its monotonic clock:
no clock of another machine is compared) is re-sent once (the first worker to claim the
re-send does it; the message says ``resent``, and a worker runs a re-sent job only while it
is still queued); a re-sent job whose message is again absent for as long is failed
``never_delivered``. A sweep that cannot read the whole backlog acts on nothing. A pending
marker left behind by a job that finished is removed, and so is one with no record once
this worker has watched it so for ``requeue_after_seconds`` (a create writes its marker
first and its record last: a gateway that died between them accepted nothing).

Its cost: one read of the backlog's messages per sweep per worker (every
``min(60 s, requeue_after_seconds / 4)``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from tiergate.jobs.state.lifecycle import JobLifecycle
from tiergate.jobs.state.store import JobStore
from tiergate.jobsettings import JobsSettings
from tiergate.protocol import JobMessage, JobStatus
from tiergate.queue.lag import backlog_reader
from tiergate.queue.pipeline import JobQueue

log = logging.getLogger("tiergate.sweep")


class Sweeper:
    """One worker's sweeps; it remembers since when each job's message has been missing."""

    def __init__(
        self,
        store: JobStore,
        queue: JobQueue,
        settings: JobsSettings,
        clock: Callable[[], float] = time.monotonic,
        backlog: Callable[[], set[str]] | None = None,
    ) -> None:
        self._store = store
        self._queue = queue
        self._requeue_after = settings.requeue_after_seconds
        self._clock = clock
        kafka = settings.kafka
        self._backlog = backlog or backlog_reader(kafka, kafka.group, kafka.topic)
        # job id -> (monotonic time its message was first found missing, resent marker)
        self._missing: dict[str, tuple[float, float | None]] = {}

    def run(self) -> int:
        """One pass; returns how many jobs it re-sent or failed."""
        pending = list(self._store.pending())
        if not pending:
            self._missing.clear()
            return 0
        ahead = self._backlog()  # raises when the backlog cannot be read whole
        now = self._clock()
        jobs = JobLifecycle(self._store)
        acted = 0
        watched: set[str] = set()
        for owner, job_id in pending:
            job = self._store.get(job_id)
            if job is None:
                # A create writes its marker before its record: one still being made, or
                # one whose gateway died part way (then nothing was accepted). Removed once
                # this worker has seen it without a record for requeue_after_seconds.
                watched.add(job_id)
                since, _ = self._missing.setdefault(job_id, (now, None))
                if now - since >= self._requeue_after:
                    self._store.drop_pending(owner, job_id)
                    del self._missing[job_id]
                    watched.discard(job_id)
                continue
            if job.status.terminal:
                self._store.drop_pending(owner, job_id)
                continue
            # Its message waits in the retry topic (a retry, or a key over its fleet share).
            retrying = (job.error or {}).get("code") in ("retrying", "fleet_share")
            if job.status is not JobStatus.QUEUED or retrying or job_id in ahead:
                continue
            watched.add(job_id)
            resent = self._store.resent_at(job_id)
            since, marker = self._missing.get(job_id, (now, resent))
            if marker != resent:
                since = now  # re-sent by another worker since: watch the new message
            self._missing[job_id] = (since, resent)
            if now - since < self._requeue_after:
                continue
            if resent is None:
                spec = self._store.spec(job_id)
                if spec is None or not self._store.mark_resent(job_id):
                    continue
                replay_of = job.replay_of if job.kind == "replay" else None
                self._queue.enqueue(
                    JobMessage(id=job_id, owner=owner, spec=spec, resent=True, replay_of=replay_of)
                )
                log.warning(
                    "job %s: its message was not in the topic for %.0fs: sent again",
                    job_id,
                    self._requeue_after,
                )
                self._missing.pop(job_id, None)
                watched.discard(job_id)
            else:
                jobs.finish(
                    job,
                    JobStatus.FAILED,
                    error={
                        "code": "never_delivered",
                        "message": "the job's message never reached a worker, even when sent again",
                    },
                )
            acted += 1
        for job_id in set(self._missing) - watched:
            del self._missing[job_id]
        return acted
