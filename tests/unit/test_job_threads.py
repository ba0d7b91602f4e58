"""Attacker's tests (issue 50): the jobs, files and batches routes ran their store calls
and file checks on the event loop's default pool (``asyncio.to_thread``), six threads on a
two-core pod, where the gateway also resolves the addresses of its engines and of Redis.
A tenant's slow store calls (a slow store, lists of thousands of files) then held every
new engine connection of every tenant. The routes now have threads of their own
(tiergate.gateway.jobs.threads).

The slow store call is a fake (a function that blocks until the test lets it go); the
wiring, the routes' runner and the loop's resolver are the real ones."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

from tiergate.gateway.access.admission import Admission
from tiergate.gateway.access.gatekeeper import Gatekeeper
from tiergate.gateway.access.limits import Limiter
from tiergate.gateway.jobs.threads import JobThreads
from tiergate.gateway.jobs.wiring import build_jobs
from tiergate.gateway.metrics import GatewayMetrics
from tiergate.settings import load_settings

# The default pool of a small pod, made explicit so that the test does not depend on this
# machine's core count (asyncio sizes it min(32, cores + 4)).
_DEFAULT_THREADS = 2


def _settings():  # type: ignore[no-untyped-def]
    return load_settings(jobs={"enabled": True, "storage_threads": 4})


def test_a_tenants_slow_store_calls_leave_the_resolver_of_engine_addresses_free() -> None:
    settings = _settings()
    gatekeeper = Gatekeeper(
        settings, Limiter(settings.limits), Admission(settings.admission, {}), GatewayMetrics({})
    )
    wiring = build_jobs(settings, gatekeeper)
    release = threading.Event()

    def slow_store_call() -> str:  # fake: a store that does not answer
        release.wait(30)
        return "listed"

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(_DEFAULT_THREADS))
        held = [
            asyncio.ensure_future(wiring.jobs.storage(slow_store_call))
            for _ in range(_DEFAULT_THREADS + 2)
        ]
        await asyncio.sleep(0.2)  # the calls have their threads
        try:
            # What httpx does before a new connection to an engine by name.
            found = await asyncio.wait_for(loop.getaddrinfo("localhost", 8000), timeout=5)
            assert found
            assert not any(h.done() for h in held)  # the store calls are still running
        finally:
            release.set()
        assert await asyncio.gather(*held) == ["listed"] * len(held)

    try:
        asyncio.run(scenario())
    finally:
        release.set()
        wiring.close()


def test_long_file_checks_and_slow_store_calls_do_not_wait_for_each_other() -> None:
    settings = _settings()
    threads = JobThreads(settings.jobs)
    release = threading.Event()

    def blocked() -> str:  # fake: a check of a huge file, or a store that does not answer
        release.wait(30)
        return "done"

    async def scenario() -> None:
        # Every spool slot's check running: a store call still runs at once.
        checks = [
            asyncio.ensure_future(threads.check(blocked))
            for _ in range(settings.jobs.max_concurrent_uploads)
        ]
        await asyncio.sleep(0.2)
        assert await asyncio.wait_for(threads.store(lambda: "stored"), 5) == "stored"
        # Every storage thread held: a check still runs at once (its slot is its thread).
        release.set()
        await asyncio.gather(*checks)
        release.clear()
        stores = [
            asyncio.ensure_future(threads.store(blocked))
            for _ in range(settings.jobs.storage_threads)
        ]
        await asyncio.sleep(0.2)
        assert await asyncio.wait_for(threads.check(lambda: "checked"), 5) == "checked"
        assert not any(s.done() for s in stores)
        release.set()
        assert set(await asyncio.gather(*stores)) == {"done"}

    try:
        asyncio.run(scenario())
    finally:
        release.set()
        threads.close()
