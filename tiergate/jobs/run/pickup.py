"""What a worker reads about a job as it picks it up: its records, its environment's name
and breaker, its deliveries and events so far, all at once (one round trip to the store
instead of seven before the first command: tiergate bench sandbox).

Some reads are speculative: the environment's name (a replay does not use it), the cancel
marker (asked only of a known job), the breaker, the deliveries and events (used by the
runner's conditional writes: reading them a moment earlier changes nothing). A failed
speculative read is None, and the one who needs it reads again; the records' reads raise.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from tiergate.envs.registry import Registered
from tiergate.jobs.run.environments import JobEnvironments
from tiergate.jobs.state.breaker import Breaker
from tiergate.jobs.state.store import JobStore, StorageError
from tiergate.protocol import Job, JobCreate, JobMessage

_T = TypeVar("_T")


@dataclass(frozen=True)
class Pickup:
    final: Job | None  # the terminal record: the job ended already
    current: Job | None  # the status record (None: the gateway's record is not there)
    spec: JobCreate | None  # the recorded spec (None: not there, or not read)
    cancel_requested: Future[bool]
    environment: Future[Registered | None] | None  # None: not looked up (a replay)
    breaker: tuple[Breaker, str | None] | None  # as BreakerBoard.read returned it
    deliveries: int | None  # pickups recorded before this one
    last_event: int | None  # the job's last event number


def read_pickup(store: JobStore, environments: JobEnvironments, message: JobMessage) -> Pickup:
    environment = message.spec.environment
    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="pickup") as reads:
        final = reads.submit(store.final, message.id)
        current = reads.submit(store.get, message.id)
        spec = reads.submit(store.spec, message.id)
        cancel = reads.submit(store.cancel_requested, message.id)
        name = None if message.replay_of else reads.submit(environments.lookup, environment)
        breaker = reads.submit(environments.read_breaker, environment)
        deliveries = reads.submit(store.deliveries, message.id)
        events = reads.submit(store.last_sequence, message.id)
    ended = final.result()
    return Pickup(
        final=ended,
        current=None if ended is not None else current.result(),
        spec=None if ended is not None else spec.result(),
        cancel_requested=cancel,
        environment=name,
        breaker=_or_none(breaker),
        deliveries=_or_none(deliveries),
        last_event=_or_none(events),
    )


def _or_none(read: Future[_T]) -> _T | None:
    try:
        return read.result()
    except StorageError:
        return None
