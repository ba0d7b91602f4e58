"""The worker's one consumer: it keeps polling while jobs run (issue 21, item 1).

One thread owns the KafkaConsumer (kafka-python's is not thread-safe) and hands records to
the worker's job slots; it never waits for a job. While every slot is busy it pauses its
partitions (the group still sees it alive: it polls, and heartbeats run in kafka-python's
own thread), and resumes them as a slot frees, so a long job never holds back the records
behind it in its partition while another slot is free. Offsets are committed in order as
jobs finish (:class:`~tiergate.queue.offsets.OffsetBook`); a commit that fails (the group
moved on during a rebalance) is logged and never ends the thread: the new owner of the
partition sees the record again, and the run lease (tiergate.jobs.state.lease) keeps it from
running twice. Rebalances are cooperative (KIP-429, ``cooperative-sticky``): a worker that
joins or leaves moves only the partitions that change owner, and the others' pickups go
on. kafka-python calls the rebalance listener on its own IO thread, where nothing may
block: it only notes the revoked partitions, which the consumer thread then forgets (their
new owner starts from the last committed position and skips what already ended).

A record whose run is held elsewhere, or that hit a store or broker outage, is tried again
after a delay without holding a slot (``later``); it stays open in the book meanwhile.

A worker whose own partitions gave it nothing for ``steal_after`` seconds while a slot is
free takes over queued jobs from busy workers' partitions (``steal``,
tiergate.jobs.run.steal); such a record is run, never committed here, and not retried.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kafka import ConsumerRebalanceListener, KafkaConsumer, TopicPartition
from kafka.errors import InconsistentGroupProtocolError, KafkaError
from kafka.structs import MemberState, OffsetAndMetadata

from tiergate.queue.offsets import OffsetBook

log = logging.getLogger("tiergate.consumer")


@dataclass(order=True)
class Work:
    """One record for a slot."""

    due: float
    tp: TopicPartition = field(compare=False)
    offset: int = field(compare=False)
    value: bytes = field(compare=False)
    tries: int = field(default=0, compare=False)
    stolen: bool = field(default=False, compare=False)  # from a partition of another


# What a slot says of a record: "done" (commit it), "later" (try again after the delay
# given), "open" (leave it uncommitted: abandoned to the next owner).
Disposition = tuple[str, float]
Handler = Callable[[int, Work], Disposition]


class _Revocations(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, owner: JobConsumer) -> None:
        self._owner = owner

    def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        self._owner.revocations.put(list(revoked))

    def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        log.info("assigned %s", sorted(tp.partition for tp in assigned))


class JobConsumer:
    """Polls ``consumer`` and runs records on ``slots`` threads through ``handle``."""

    def __init__(
        self,
        make_consumer: Callable[[ConsumerRebalanceListener], KafkaConsumer],
        slots: int,
        handle: Handler,
        stopping: threading.Event,
        beat: Callable[[str], None],
        busy: Callable[[str], Any],
        steal: Callable[[int, set[TopicPartition]], list[tuple[TopicPartition, int, bytes]]]
        | None = None,
        steal_after: float = 2.0,
        refused: Callable[[], object] = lambda: None,
    ) -> None:
        self._make_consumer = make_consumer
        self._refused = refused  # the group refused our assignor (tiergate.queue.membership)
        self._slots = slots
        self._handle = handle
        self._stopping = stopping
        self._beat = beat
        self._busy = busy
        self._book: OffsetBook[TopicPartition] = OffsetBook()
        self._free: deque[int] = deque(range(slots))
        self._inboxes: list[queue.Queue[Work | None]] = [queue.Queue() for _ in range(slots)]
        self._done: queue.Queue[tuple[int, Work, Disposition]] = queue.Queue()
        self._later: list[Work] = []  # a heap by due time
        self._waiting: deque[Work] = deque()  # taken from a poll with no slot free
        self._consumer: KafkaConsumer | None = None
        self._steal = steal
        self._steal_after = steal_after
        # The look at the others' partitions runs in a thread of its own: it takes a new
        # client and seconds of fetches, and this thread must keep polling meanwhile (a
        # member that polls late joins a rebalance late, and the whole group waits for it:
        # in a churning fleet the group then never settled, bench jobs --batch).
        self._looking: Future[list[tuple[TopicPartition, int, bytes]]] | None = None
        self._lookout: ThreadPoolExecutor | None = None
        self._last_record = time.monotonic()
        self._next_steal = 0.0
        self.assigned: frozenset[TopicPartition] = frozenset()  # as of the last poll
        # The member is in a stable generation, its assignment known (kafka-python calls
        # the listener only for partitions added, so a member given none hears nothing):
        # before that ``assigned`` is empty and a partition stolen from could be this
        # member's own (its record then comes again from the poll), so there is no stealing.
        self.joined = False
        self.revocations: queue.Queue[list[TopicPartition]] = queue.Queue()
        self._running = 0
        self.commit_failures = 0
        self.picked: list[float] = []  # monotonic times records went to a slot (gaps)

    # -- slots ------------------------------------------------------------------------------

    def slot(self, index: int, name: str) -> None:
        """A slot thread's body: run what the consumer hands it until told to stop."""
        inbox = self._inboxes[index]
        while True:
            self._beat(name)
            try:
                work = inbox.get(timeout=0.5)
            except queue.Empty:
                continue
            if work is None:
                return
            try:
                with self._busy(name):
                    verdict = self._handle(index, work)
            except Exception:  # the handler ends every job itself; this is a last guard
                log.exception("slot %d: record %s:%d", index, work.tp, work.offset)
                verdict = ("done", 0.0)
            self._done.put((index, work, verdict))

    def _give(self, work: Work) -> None:
        index = self._free.popleft()
        self._running += 1
        self.picked.append(time.monotonic())
        del self.picked[:-1000]
        self._inboxes[index].put(work)

    # -- the consumer thread ------------------------------------------------------------------

    def run(self, drain_deadline: Callable[[], float], abandon: Callable[[], None]) -> None:
        consumer = self._make_consumer(_Revocations(self))
        self._consumer = consumer
        try:
            while not self._stopping.is_set():
                self._beat("consumer")
                self._forget_revoked()
                self._collect()
                self._feed()
                self._flow(consumer)
                try:
                    polled = consumer.poll(timeout_ms=200, max_records=max(1, len(self._free)))
                except InconsistentGroupProtocolError:
                    consumer = self._rejoin(consumer)
                    continue
                except KafkaError as exc:
                    log.warning("poll failed: %r", exc)
                    self._stopping.wait(1.0)
                    continue
                self._forget_revoked()
                with contextlib.suppress(KafkaError, AssertionError):
                    self.assigned = frozenset(consumer.assignment())
                self.joined = _stable(consumer)
                for tp, records in polled.items():
                    for record in records:
                        self._book.take(tp, record.offset)
                        self._waiting.append(Work(0.0, tp, record.offset, record.value))
                        self._last_record = time.monotonic()
                self._feed()
                self._take_over(consumer)
                self._commit(consumer)
            self._drain(consumer, drain_deadline(), abandon)
        finally:
            if self._lookout is not None:
                self._lookout.shutdown(wait=False, cancel_futures=True)
            for inbox in self._inboxes:
                inbox.put(None)
            try:
                consumer.close(autocommit=False)
            except Exception as exc:  # closing a consumer of a broker that went away
                log.warning("consumer close: %r", exc)

    def _rejoin(self, consumer: KafkaConsumer) -> KafkaConsumer:
        """The group runs another assignor: join again offering the next one. What this
        member held is forgotten (running jobs go on; their records' owner waits on the
        lease)."""
        self.revocations.put(list(self.assigned))
        self._forget_revoked()
        self.assigned, self.joined = frozenset(), False
        with contextlib.suppress(Exception):
            consumer.close(autocommit=False)
        self._refused()
        self._consumer = self._make_consumer(_Revocations(self))
        return self._consumer

    def _take_over(self, consumer: KafkaConsumer) -> None:
        """Idle with a free slot: run queued jobs of busy workers' partitions (found by a
        look in the background; what it found by the time it answers is taken if this
        member is still idle, and the run lease settles any race with the owner)."""
        if self._looking is not None:
            if not self._looking.done():
                return
            looked, self._looking = self._looking, None
            try:
                found = looked.result()
            except Exception as exc:  # a look that failed finds nothing
                log.debug("no look at the others' partitions: %r", exc)
                found = []
            for tp, offset, value in found:
                if not self._free or self._waiting or not self.joined:
                    break
                if tp not in self.assigned:
                    self._give(Work(0.0, tp, offset, value, stolen=True))
            return
        now = time.monotonic()
        if (
            self._steal is None
            or not self.joined
            or not self._free
            or self._waiting
            or (self._later and self._later[0].due <= now)
            or now - self._last_record < self._steal_after
            or now < self._next_steal
        ):
            return
        self._next_steal = now + self._steal_after
        if self._lookout is None:
            self._lookout = ThreadPoolExecutor(max_workers=1, thread_name_prefix="steal")
        self._looking = self._lookout.submit(self._steal, len(self._free), set(self.assigned))

    def _flow(self, consumer: KafkaConsumer) -> None:
        """Pause every partition while no slot is free; resume them when one is."""
        try:
            if self._free and not self._waiting:
                paused = consumer.paused()
                if paused:
                    consumer.resume(*paused)
            else:
                consumer.pause(*consumer.assignment())
        except (KafkaError, AssertionError) as exc:  # assignment changing under us
            log.debug("pause/resume: %r", exc)

    def _feed(self) -> None:
        now = time.monotonic()
        while self._free and self._later and self._later[0].due <= now:
            work = heapq.heappop(self._later)
            if self._book.owns(work.tp):
                self._give(work)
        while self._free and self._waiting:
            work = self._waiting.popleft()
            if self._book.owns(work.tp):
                self._give(work)

    def _collect(self) -> None:
        while True:
            try:
                index, work, (what, delay) = self._done.get_nowait()
            except queue.Empty:
                return
            self._free.append(index)
            self._running -= 1
            if work.stolen:
                continue  # its partition's owner commits it
            if what == "done":
                self._book.finish(work.tp, work.offset)
            elif what == "later" and self._book.owns(work.tp):
                work.due, work.tries = time.monotonic() + delay, work.tries + 1
                heapq.heappush(self._later, work)
            # "open": left uncommitted for the partition's next owner

    def _commit(self, consumer: KafkaConsumer) -> None:
        moved = self._book.to_commit()
        if not moved:
            return
        try:
            consumer.commit({tp: OffsetAndMetadata(pos, "", -1) for tp, pos in moved.items()})
            self._book.committed(moved)
        except (KafkaError, AssertionError) as exc:
            # A rebalance took the partitions (or the broker is away): the next owner
            # starts from the last committed position; the leases keep the runs single.
            self.commit_failures += 1
            log.warning("commit of %s failed: %r", moved, exc)

    def _forget_revoked(self) -> None:
        """Forget partitions revoked since the last look (a job still running there goes
        on; its record's next owner waits on its lease), and drop their records not
        started yet."""
        while True:
            try:
                partitions = self.revocations.get_nowait()
            except queue.Empty:
                return
            if not partitions:
                continue
            self._book.drop(partitions)
            gone = set(partitions)
            self._later = [w for w in self._later if w.tp not in gone]
            heapq.heapify(self._later)
            self._waiting = deque(w for w in self._waiting if w.tp not in gone)
            log.info("revoked %s", sorted(tp.partition for tp in partitions))

    def _drain(self, consumer: KafkaConsumer, deadline: float, abandon: Callable[[], None]) -> None:
        """Stopping: take nothing new, let running jobs finish until ``deadline``, then
        abandon the rest (uncommitted: they run again elsewhere), committing as they end."""
        self._later.clear()
        self._waiting.clear()
        told = False
        hard = deadline + 15.0
        while self._running > 0 and time.monotonic() < hard:
            if not told and time.monotonic() >= deadline:
                abandon()
                told = True
            self._collect()
            self._commit(consumer)
            with contextlib.suppress(KafkaError, AssertionError):
                consumer.pause(*consumer.assignment())
                consumer.poll(timeout_ms=100)
        self._collect()
        self._commit(consumer)

    @property
    def running(self) -> int:
        return self._running


def _stable(consumer: KafkaConsumer) -> bool:
    """The consumer is a member of a stable generation (kafka-python's group metadata)."""
    try:
        meta = consumer.group_metadata()
    except Exception:  # an older client, or one closing
        return False
    return bool(meta.state == MemberState.STABLE and meta.generation_id >= 0)
