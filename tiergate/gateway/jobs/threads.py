"""The jobs, files and batches routes' own threads.

Their blocking work ran on the event loop's default pool (``asyncio.to_thread``), which on
a two-core pod has six threads and is also where the gateway resolves the addresses of its
engines and of Redis (``loop.getaddrinfo``: every new connection of the interactive path).
A tenant's slow store calls (a list of 10,000 files, a store that answers slowly) or a few
uploads being checked then held every new engine connection of every tenant.

So the routes get pools of their own, which the app's lifespan shuts down:

- ``storage``: calls to object storage and to the queue (``jobs.storage_threads``), each
  key's reads bounded in flight (tiergate.gateway.access.readcost);
- ``checks``: the checks of spooled files (upload archives, batch inputs), CPU-bound and
  up to a minute long. Every check runs under a spool slot
  (tiergate.gateway.jobs.uploads.SpoolSlots), so the pool has one thread per slot: a check
  never waits for a thread, and one key's checks, held to its share of the slots, cannot
  make another key's wait;
- ``streams``: the event streams' storage polls (``jobs.stream_threads``), apart from the
  creates'.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from tiergate.jobsettings import JobsSettings

_T = TypeVar("_T")


class JobThreads:
    """One gateway's threads for the jobs, files and batches routes (one per app)."""

    def __init__(self, settings: JobsSettings) -> None:
        self.storage = ThreadPoolExecutor(
            max_workers=settings.storage_threads, thread_name_prefix="job-storage"
        )
        self.checks = ThreadPoolExecutor(
            max_workers=settings.max_concurrent_uploads, thread_name_prefix="file-checks"
        )
        self.streams = ThreadPoolExecutor(
            max_workers=settings.stream_threads, thread_name_prefix="job-events"
        )

    async def store(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` on the storage threads (as ``asyncio.to_thread`` would run it, the
        caller's context variables included)."""
        return await _run(self.storage, fn, *args)

    async def check(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` on the check threads."""
        return await _run(self.checks, fn, *args)

    def close(self) -> None:
        for pool in (self.storage, self.checks, self.streams):
            pool.shutdown(wait=False, cancel_futures=True)


async def _run(pool: ThreadPoolExecutor, fn: Callable[..., _T], *args: Any) -> _T:
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    return await asyncio.get_running_loop().run_in_executor(pool, call)
