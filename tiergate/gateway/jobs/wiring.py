"""The jobs API, built only when ``jobs.enabled``: the app imports this module then and only
then, so that a gateway without jobs loads neither kafka nor boto3 (nor the job store)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from tiergate.gateway.access.gatekeeper import Gatekeeper
from tiergate.gateway.jobs.api import JobsAPI
from tiergate.gateway.jobs.batches import BatchesAPI
from tiergate.gateway.jobs.files import FilesAPI
from tiergate.gateway.jobs.openaibatch.api import BatchAPI
from tiergate.gateway.jobs.openaibatch.inputfile import upload_plan
from tiergate.gateway.jobs.threads import JobThreads
from tiergate.jobs.lines.store import LineBatchStore
from tiergate.jobs.state.files import FileStore
from tiergate.jobs.state.store import JobStore
from tiergate.queue.pipeline import JobQueue
from tiergate.settings import Settings


@dataclass(slots=True)
class JobsWiring:
    """What the jobs routes use, and what the app's lifespan closes when it ends."""

    jobs: JobsAPI
    batches: BatchesAPI
    files: FilesAPI
    openai_batches: BatchAPI
    queue: JobQueue
    threads: JobThreads

    def close(self) -> None:
        self.jobs.close()
        self.queue.close()
        self.threads.close()


def build_jobs(settings: Settings, gatekeeper: Gatekeeper) -> JobsWiring:
    store = JobStore(settings.jobs.storage)
    queue = JobQueue(settings.jobs.kafka)
    threads = JobThreads(settings.jobs)
    jobs = JobsAPI(
        settings.jobs, store, queue, gatekeeper, settings.gateway.max_body_bytes, threads
    )
    batches = BatchesAPI(jobs, store, settings.gateway.max_body_bytes, settings.jobs)
    file_store = FileStore(store)
    openai_batches = BatchAPI(
        settings.jobs.batch_api,
        LineBatchStore(store),
        file_store,
        queue,
        gatekeeper,
        jobs.storage,
        jobs.read,
        settings.gateway.max_body_bytes,
        settings.limits.chars_per_token,
        settings.gateway.max_tokens_limit,
        jobs.spool_slots,
        threads.check,
    )
    files = FilesAPI(
        settings.jobs,
        file_store,
        gatekeeper,
        jobs.storage,
        jobs.read,
        jobs.spool_slots,
        settings.gateway.max_body_bytes,
        threads.check,
        functools.partial(upload_plan, rules=openai_batches.rules("")),
    )
    return JobsWiring(jobs, batches, files, openai_batches, queue, threads)
