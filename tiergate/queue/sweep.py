"""The sweep: no accepted job stays queued forever, whatever happened between the object
store and the broker.

A job is recorded in object storage before its message is produced; a gateway that dies
in between, or a broker that loses an acknowledged message (an in-memory broker
restarting), leaves a job ``queued`` with no message. Every worker sweeps the unfinished
jobs now and then: a job still queued ``requeue_after_seconds`` after it was accepted is
re-sent once (the first worker to claim the re-send does it; the message says ``resent``,
and a worker runs a re-sent job only while it is still queued); a re-sent job still queued
after another ``requeue_after_seconds`` is failed. A pending marker left behind by a job
that finished is removed.
"""

from __future__ import annotations

import logging
import time

from tiergate.protocol import JobMessage, JobStatus
from tiergate.queue.lifecycle import JobLifecycle
from tiergate.queue.pipeline import JobQueue
from tiergate.queue.store import JobStore

log = logging.getLogger("tiergate.sweep")


def sweep(store: JobStore, queue: JobQueue, requeue_after: float, now: float | None = None) -> int:
    """One pass; returns how many jobs it re-sent or failed."""
    now = time.time() if now is None else now
    jobs = JobLifecycle(store)
    acted = 0
    for owner, job_id in list(store.pending()):
        job = store.get(job_id)
        if job is None or job.status.terminal:
            store.drop_pending(owner, job_id)
            continue
        waiting = job.status is JobStatus.QUEUED and (job.error or {}).get("code") != "retrying"
        if not waiting or now - job.created_at_ms / 1000 < requeue_after:
            continue
        resent = store.resent_at(job_id)
        if resent is None:
            spec = store.spec(job_id)
            if spec is None or not store.mark_resent(job_id, now):
                continue
            queue.enqueue(JobMessage(id=job_id, owner=owner, spec=spec, resent=True))
            log.warning("job %s was still queued after %.0fs: sent again", job_id, requeue_after)
            acted += 1
        elif now - resent >= requeue_after:
            jobs.finish(
                job,
                JobStatus.FAILED,
                error={
                    "code": "never_delivered",
                    "message": "the job's message never reached a worker, even when sent again",
                },
            )
            acted += 1
    return acted
