"""The jobs API, built only when ``jobs.enabled``: the app imports this module then and only
then, so that a gateway without jobs loads neither kafka nor boto3 (nor the job store)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tiergate.gateway.access.gatekeeper import Gatekeeper
from tiergate.gateway.jobs.api import JobsAPI
from tiergate.gateway.jobs.batches import BatchesAPI
from tiergate.gateway.jobs.files import FilesAPI
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
    queue: JobQueue
    stream_pool: ThreadPoolExecutor

    def close(self) -> None:
        self.jobs.close()
        self.queue.close()
        self.stream_pool.shutdown(wait=False, cancel_futures=True)


def build_jobs(settings: Settings, gatekeeper: Gatekeeper) -> JobsWiring:
    store = JobStore(settings.jobs.storage)
    queue = JobQueue(settings.jobs.kafka)
    # The job event streams' storage polls, apart from every other route's threads.
    stream_pool = ThreadPoolExecutor(
        max_workers=settings.jobs.stream_threads, thread_name_prefix="job-events"
    )
    jobs = JobsAPI(
        settings.jobs, store, queue, gatekeeper, settings.gateway.max_body_bytes, stream_pool
    )
    batches = BatchesAPI(jobs, store, settings.gateway.max_body_bytes, settings.jobs)
    files = FilesAPI(settings.jobs.files, FileStore(store), gatekeeper, jobs.storage)
    return JobsWiring(jobs, batches, files, queue, stream_pool)
