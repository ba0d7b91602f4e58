"""One run per job: a pickup takes a lease in object storage, and every later write of
that run is fenced by it.

Keys, under the job's prefix (``{id}/`` of :class:`tiergate.jobs.state.store.JobStore`):

    runs/NNNN       the run's lease: written once (If-None-Match), NNNN its epoch from 1
    runs/NNNN.beat  its heartbeat: a counter the holder rewrites every ``ttl / 3``;
                    ``released`` once the holder hands the job back (drain, retry)

Taking: no run yet, or the latest run released, means write epoch ``latest + 1`` once; two
pickups racing for it get one winner (the other is :data:`HELD`). A latest run that still
beats is held: the pickup waits (the worker tries the message again later, without a
slot). A run whose beat has not changed for ``ttl`` seconds *as this worker watched it*
is expired and taken over at the next epoch. Expiry is judged only on the watcher's own
monotonic clock, never by comparing timestamps of two machines, so clock skew between
workers or with the store changes nothing (issue 21, item 3).

Fencing: a run writes only while :meth:`RunLease.valid`, which is true for ``0.8 * ttl``
after the start of the holder's last beat that landed (a taker must watch one beat value
unchanged for ``ttl`` from when it landed, so no other epoch can exist before then; the
margin covers the write's own latency). Past that (a worker frozen or cut off from the
store) ``valid`` asks the store: a higher epoch means this run is fenced out for good, and
it stops and writes nothing more; otherwise it beats again and goes on. Artifacts are
stored under the run's own epoch and the terminal record names it (``Job.run``), so a
fenced-out run that slipped one last write past its check still cannot replace the
winner's artifacts; the terminal record itself is write-once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tiergate.objectstore import ObjectStore, StorageError

log = logging.getLogger("tiergate.lease")

RELEASED = b"released"
# A watched run is forgotten after this long unobserved (its job moved on elsewhere).
_FORGET_AFTER = 3600.0


class Fenced(Exception):
    """This run's lease was taken over: it must stop and write nothing."""


@dataclass
class _Watch:
    epoch: int
    beat: bytes
    since: float  # monotonic time this beat value was first seen here
    seen: float  # monotonic time of the last look


@dataclass
class RunLease:
    """This worker's hold on one job's run (epoch ``epoch``)."""

    job_id: str
    epoch: int
    _leases: Leases
    _beats: int = 0
    _safe_until: float = 0.0
    fenced: bool = False
    released: bool = False
    on_fenced: Callable[[], None] = field(default=lambda: None)

    def beat(self) -> bool:
        """Rewrite the heartbeat; False (and :attr:`fenced`) when a later epoch exists."""
        if self.fenced or self.released:
            return not self.fenced
        started = self._leases.clock()
        self._beats += 1
        self._leases.objects.put(
            self._leases.beat_key(self.job_id, self.epoch), b"%d" % self._beats
        )
        if self._leases.latest(self.job_id) > self.epoch:
            self._fence()
            return False
        self._safe_until = started + 0.8 * self._leases.ttl
        return True

    def valid(self) -> bool:
        """True while this run may write (see the module's text); a check past the safe
        window asks the store and beats again. A store that cannot answer raises
        StorageError: the run neither writes nor counts itself fenced (its caller's
        transient-failure path handles it, as any other write's failure)."""
        if self.fenced:
            return False
        if self._leases.clock() < self._safe_until:
            return True
        return self.beat()

    def check(self) -> None:
        """Raise :class:`Fenced` unless this run may write."""
        if not self.valid():
            raise Fenced(f"job {self.job_id}: run {self.epoch} was taken over by a later run")

    def _fence(self) -> None:
        if not self.fenced:
            self.fenced = True
            log.warning("job %s: run %d fenced out by a later run", self.job_id, self.epoch)
            self.on_fenced()

    def release(self) -> None:
        """Hand the job back: a next pickup takes it at once, without waiting for expiry."""
        if self.fenced or self.released:
            return
        self.released = True
        try:
            if self._leases.latest(self.job_id) == self.epoch:
                self._leases.objects.put(self._leases.beat_key(self.job_id, self.epoch), RELEASED)
        except StorageError as exc:
            log.warning("job %s: lease not released (%s); it expires instead", self.job_id, exc)


class Held:
    """A pickup that found the job's run held by a live lease elsewhere."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def __repr__(self) -> str:
        return f"Held(epoch={self.epoch})"


class Leases:
    """The leases one worker takes, watches and keeps beating (one per worker process,
    shared by its slots). ``keys(job_id, name)`` is the job store's key layout."""

    def __init__(
        self,
        objects: ObjectStore,
        keys: Callable[[str, str], str],
        ttl: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.objects = objects
        self._keys = keys
        self.ttl = ttl
        self.clock = clock
        self._watches: dict[str, _Watch] = {}
        self._held: dict[str, RunLease] = {}
        self._lock = threading.Lock()

    def run_key(self, job_id: str, epoch: int) -> str:
        return self._keys(job_id, f"runs/{epoch:04d}")

    def beat_key(self, job_id: str, epoch: int) -> str:
        return self._keys(job_id, f"runs/{epoch:04d}.beat")

    def latest(self, job_id: str) -> int:
        """The job's highest run epoch (0: never run)."""
        epochs = [
            int(name[-4:])
            for key in self.objects.keys(self._keys(job_id, "runs/"))
            if (name := key.rsplit("/", 1)[1]).isdigit()
        ]
        return max(epochs, default=0)

    def take(self, job_id: str, holder: str) -> RunLease | Held:
        """This worker's lease on the job's next run, or :class:`Held` while another
        run's lease lives (raises StorageError when the store cannot say)."""
        latest = self.latest(job_id)
        if latest:
            beat = self.objects.get(self.beat_key(job_id, latest))
            if beat != RELEASED and not self._expired(job_id, latest, beat or b""):
                return Held(latest)
        epoch = latest + 1
        body = f"{holder} {time.time():.3f}".encode()
        if not self.objects.put_once(self.run_key(job_id, epoch), body):
            return Held(epoch)  # another pickup took this epoch a moment ago
        lease = RunLease(job_id, epoch, self)
        lease.beat()
        with self._lock:
            self._watches.pop(job_id, None)
            self._held[job_id] = lease
        return lease

    def _expired(self, job_id: str, epoch: int, beat: bytes) -> bool:
        now = self.clock()
        with self._lock:
            for key, old in list(self._watches.items()):
                if now - old.seen > _FORGET_AFTER:
                    del self._watches[key]
            watch = self._watches.get(job_id)
            if watch is None or watch.epoch != epoch or watch.beat != beat:
                self._watches[job_id] = _Watch(epoch, beat, now, now)
                return False
            watch.seen = now
            return now - watch.since >= self.ttl

    def done(self, lease: RunLease) -> None:
        """The run ended (its terminal record written, or handed back)."""
        with self._lock:
            if self._held.get(lease.job_id) is lease:
                del self._held[lease.job_id]

    def held(self) -> list[RunLease]:
        with self._lock:
            return list(self._held.values())

    def beat_all(self) -> None:
        """One heartbeat of every run this worker holds (the keeper thread, every
        ``ttl / 3``); a run found fenced is told through its ``on_fenced``."""
        for lease in self.held():
            try:
                lease.beat()
            except StorageError as exc:
                log.warning("job %s: heartbeat not written: %s", lease.job_id, exc)
