"""Run leases on a real S3 API server (tiergate.jobs.state.lease), with the watchers' clocks
moved by hand; and the commit positions of a worker running several jobs at once."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from tiergate.jobs.state.lease import Fenced, Held, Leases, RunLease
from tiergate.jobs.state.store import JobStore
from tiergate.jobsettings import StorageSettings
from tiergate.queue.offsets import OffsetBook


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(s3: str) -> JobStore:
    store = JobStore(StorageSettings(endpoint_url=s3, bucket=f"leases-{uuid.uuid4().hex[:8]}"))
    store.ensure_bucket()
    return store


def _leases(store: JobStore, clock: Clock, ttl: float = 30.0) -> Leases:
    return Leases(store.objects, store._key, ttl, clock=clock)


def test_two_pickups_of_one_job_get_one_run(store: JobStore) -> None:
    a, b = Clock(), Clock()
    first = _leases(store, a).take("job_1", "worker-a")
    second = _leases(store, b).take("job_1", "worker-b")
    assert isinstance(first, RunLease) and first.epoch == 1
    assert isinstance(second, Held) and second.epoch == 1


def test_pickups_racing_for_one_job_get_one_run(store: JobStore) -> None:
    """Eight pickups of each of ten jobs at once, each from a worker of its own (its own
    clock; one object store client between them, as the fence is the store's): the
    conditional write is the only fence between them, and each job gets exactly one run,
    held by one of them."""
    workers = [_leases(store, Clock()) for _ in range(8)]
    for n in range(10):
        job_id = f"job_race_{n}"
        start = threading.Barrier(len(workers))

        def take(index: int, job_id: str = job_id, start: threading.Barrier = start) -> object:
            start.wait()
            return workers[index].take(job_id, f"worker-{index}")

        with ThreadPoolExecutor(len(workers)) as pool:
            got = list(pool.map(take, range(len(workers))))
        runs = [g for g in got if isinstance(g, RunLease)]
        assert len(runs) == 1, (job_id, got)
        assert all(isinstance(g, Held) and g.epoch == 1 for g in got if g is not runs[0]), got
        assert runs[0].epoch == 1


def test_a_beating_lease_is_never_taken_over(store: JobStore) -> None:
    a, b = Clock(), Clock()
    holder = _leases(store, a, ttl=30)
    watcher = _leases(store, b, ttl=30)
    lease = holder.take("job_1", "a")
    assert isinstance(lease, RunLease)
    for _ in range(10):  # 100 s of the watcher's time, a beat every 10 s
        b.now += 10
        a.now += 10
        holder.beat_all()
        assert isinstance(watcher.take("job_1", "b"), Held)
    assert lease.valid()


def test_a_silent_lease_expires_on_the_watchers_own_clock_and_fences_its_holder(
    store: JobStore,
) -> None:
    a, b = Clock(), Clock()
    b.now = 5_000_000.0  # another machine's clock: only its own intervals count
    holder = _leases(store, a, ttl=30)
    watcher = _leases(store, b, ttl=30)
    lease = holder.take("job_1", "a")
    assert isinstance(lease, RunLease)
    fenced: list[bool] = []
    lease.on_fenced = lambda: fenced.append(True)
    assert isinstance(watcher.take("job_1", "b"), Held)  # first seen: the watch starts
    b.now += 29
    assert isinstance(watcher.take("job_1", "b"), Held)
    b.now += 2  # the same beat for 31 s of the watcher's time
    taken = watcher.take("job_1", "b")
    assert isinstance(taken, RunLease) and taken.epoch == 2
    # The holder was frozen: past its safe window it asks the store, and stops.
    a.now += 60
    with pytest.raises(Fenced):
        lease.check()
    assert fenced == [True] and not lease.valid()
    assert taken.valid()


def test_a_holder_inside_its_safe_window_writes_without_asking(store: JobStore) -> None:
    a = Clock()
    lease = _leases(store, a, ttl=30).take("job_1", "a")
    assert isinstance(lease, RunLease)
    calls: list[str] = []
    original = store.objects.keys
    store.objects.keys = lambda *args, **kw: calls.append("list") or original(*args, **kw)  # type: ignore[method-assign]
    a.now += 23  # under 0.8 * ttl since the last beat started
    lease.check()
    assert calls == []
    a.now += 2  # past it: one look at the store (and a beat)
    lease.check()
    assert calls == ["list"]


def test_a_released_lease_is_taken_at_once(store: JobStore) -> None:
    a, b = Clock(), Clock()
    lease = _leases(store, a).take("job_1", "a")
    assert isinstance(lease, RunLease)
    lease.release()
    taken = _leases(store, b).take("job_1", "b")
    assert isinstance(taken, RunLease) and taken.epoch == 2


def test_commit_positions_follow_the_lowest_open_offset() -> None:
    book: OffsetBook[int] = OffsetBook()
    for offset in (10, 11, 12):
        book.take(0, offset)
    assert book.position(0) == 10
    book.finish(0, 11)  # a short job behind a long one ends first
    book.finish(0, 12)
    assert book.to_commit() == {0: 10}  # the long one still runs: nothing past it
    book.committed({0: 10})
    assert book.to_commit() == {}
    book.finish(0, 10)
    assert book.to_commit() == {0: 13}
    book.take(1, 7)
    book.drop([1])  # revoked while its job ran: the new owner commits it
    book.finish(1, 7)
    assert book.position(1) is None and not book.owns(1)
