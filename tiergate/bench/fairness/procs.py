"""The fairness benchmark's gateway and floods, each in a process of its own.

A tenant's client is not in another tenant's process, nor in the gateway's: run as
threads and tasks of the measuring process, tenant B's first chunk waited for the same
interpreter to relay and read tenant A's sixteen streams, which added its own delay to
B's time to first token (on a 2-core AMD EPYC Zen 5 about 25 ms of 130, more than the
gateway's whole overhead alone). Processes share only the machine, as real tenants do.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import queue
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.synchronize import Event as MpEvent
from typing import TYPE_CHECKING, Any

import httpx

from tiergate.bench.urgency.gateway import UrgencyBenchError
from tiergate.measure.stream import Sample
from tiergate.measure.wait import wait_until
from tiergate.settings import Settings

if TYPE_CHECKING:
    from tiergate.bench.fairness.bench import FairnessParams


def _spawn() -> Any:
    """Spawned, not forked: a fork of a process with threads and an event loop may
    inherit held locks."""
    return mp.get_context("spawn")


def _serve(settings: Settings) -> None:
    import uvicorn

    from tiergate.gateway.app import create_app
    from tiergate.gateway.serving import uvicorn_options

    uvicorn.run(
        create_app(settings),
        host=settings.gateway.host,
        port=settings.gateway.port,
        lifespan="on",
        **uvicorn_options(settings.gateway),
    )


@contextmanager
def gateway_in_process(settings: Settings, key: str) -> Iterator[str]:
    """Serve the gateway in a process of its own for the block; its base URL (ready once
    ``GET /v1/models`` answers ``key``)."""
    process = _spawn().Process(target=_serve, args=(settings,), name="bench-gateway", daemon=True)
    process.start()
    base = f"http://{settings.gateway.host}:{settings.gateway.port}"

    def ready() -> bool:
        if not process.is_alive():
            return True
        try:
            answer = httpx.get(
                f"{base}/v1/models", headers={"authorization": f"Bearer {key}"}, timeout=2
            )
        except httpx.HTTPError:
            return False
        return answer.status_code == 200

    try:
        wait_until(ready, 60, 0.1)
        if not process.is_alive():
            raise UrgencyBenchError("the benchmark's gateway did not start (see its log above)")
        yield base
    finally:
        process.terminate()
        process.join(30)


def _flood_main(
    params: FairnessParams,
    base: str,
    keys: dict[str, str],
    tenant: str,
    stop: MpEvent,
    started: MpEvent,
    results: mp.Queue[list[Sample]],
) -> None:
    from tiergate.bench.fairness.bench import _Run

    async def main() -> list[Sample]:
        run = _Run(params, base, keys)
        done, first = asyncio.Event(), asyncio.Event()
        samples: list[Sample] = []

        async def watch() -> None:
            while not stop.is_set():
                if first.is_set():
                    started.set()
                await asyncio.sleep(0.05)
            done.set()

        await asyncio.gather(run.flood(tenant, samples, done, first), watch())
        return samples

    results.put(asyncio.run(main()))


def _gauges_main(
    base: str,
    engine: str,
    t0: float,
    every: float,
    stop: MpEvent,
    started: MpEvent,
    results: mp.Queue[list[tuple[float, float, float, float]]],
) -> None:
    from tiergate.bench.fairness.bench import read_gauges

    async def main() -> list[tuple[float, float, float, float]]:
        gauges: list[tuple[float, float, float, float]] = []
        while not stop.is_set():
            try:
                limit, running, waiting = await read_gauges(base, engine)
                gauges.append((time.perf_counter() - t0, limit, running, waiting))
            except httpx.HTTPError:
                pass
            await asyncio.sleep(every)
        return gauges

    results.put(asyncio.run(main()))


class _Child:
    """A process of its own that runs until told to stop and then puts one result."""

    def __init__(self, name: str, target: Any, args: tuple[Any, ...]) -> None:
        spawn = _spawn()
        self._stop, self._started = spawn.Event(), spawn.Event()
        self._results: mp.Queue[Any] = spawn.Queue()
        self._process = spawn.Process(
            target=target,
            args=(*args, self._stop, self._started, self._results),
            name=name,
            daemon=True,
        )
        self._process.start()

    async def _result(self) -> Any:
        self._stop.set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 600
        while loop.time() < deadline and (self._process.is_alive() or not self._results.empty()):
            try:
                result = self._results.get_nowait()
            except queue.Empty:
                await asyncio.sleep(0.1)
                continue
            self._process.join(30)
            return result
        self._process.kill()
        raise UrgencyBenchError(f"{self._process.name} did not end")


class Gauges(_Child):
    """The gateway's tier limit and the engine's running and waiting requests every
    ``every`` seconds, read and parsed in a process of its own: parsing vLLM's metrics in
    B's process held B's event loop (an outlier of 150-300 ms in B's time alone)."""

    def __init__(self, base: str, engine: str, t0: float, every: float) -> None:
        super().__init__("gauges", _gauges_main, (base, engine, t0, every))

    async def stop(self) -> list[tuple[float, float, float, float]]:
        gauges: list[tuple[float, float, float, float]] = await self._result()
        return gauges


class Flood(_Child):
    """``tenant`` keeping ``params.flood`` streams going, from a process of its own."""

    def __init__(
        self, params: FairnessParams, base: str, keys: dict[str, str], tenant: str
    ) -> None:
        super().__init__(f"flood-{tenant}", _flood_main, (params, base, keys, tenant))

    async def started(self, within: float) -> None:
        """Until each of the flood's streams has had a first token."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while not self._started.is_set():
            if not self._process.is_alive() or loop.time() > deadline:
                raise UrgencyBenchError(f"the flood ({self._process.name}) did not start")
            await asyncio.sleep(0.1)

    async def stop(self) -> list[Sample]:
        """Stop after the streams in flight end; their samples."""
        samples: list[Sample] = await self._result()
        return samples
