"""Which offset a worker may commit on each partition while several of its jobs run at once.

Records of one partition are taken in offset order but finish in any order. The position
committed is the lowest offset still open (taken, not finished), or one past the last
taken when none is: everything below it is finished, so a crash redelivers only jobs that
had not ended (which the runner skips if they did end, by their terminal record). Gaps in
a partition's offsets (compaction, control records) need no care: only taken offsets count.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

P = TypeVar("P", bound=Hashable)


class OffsetBook(Generic[P]):
    """Open and finished offsets per partition ``P``, and the positions to commit."""

    def __init__(self) -> None:
        self._open: dict[P, set[int]] = {}
        self._next: dict[P, int] = {}  # one past the highest offset taken
        self._committed: dict[P, int] = {}

    def take(self, partition: P, offset: int) -> None:
        self._open.setdefault(partition, set()).add(offset)
        self._next[partition] = max(self._next.get(partition, 0), offset + 1)

    def finish(self, partition: P, offset: int) -> None:
        """The record's job ended here (or needs no run); unknown partitions (revoked
        while the job ran) are ignored: their new owner commits them."""
        opened = self._open.get(partition)
        if opened is not None:
            opened.discard(offset)

    def owns(self, partition: P) -> bool:
        return partition in self._next

    def position(self, partition: P) -> int | None:
        """The offset to commit for ``partition`` (None: nothing taken there)."""
        if partition not in self._next:
            return None
        opened = self._open.get(partition)
        return min(opened) if opened else self._next[partition]

    def to_commit(self) -> dict[P, int]:
        """Positions that moved since :meth:`committed` was last told of them."""
        moved = {}
        for partition in self._next:
            position = self.position(partition)
            if position is not None and position != self._committed.get(partition):
                moved[partition] = position
        return moved

    def committed(self, positions: dict[P, int]) -> None:
        self._committed.update(positions)

    def drop(self, partitions: Iterable[P]) -> None:
        """Forget partitions this worker no longer owns."""
        for partition in partitions:
            self._open.pop(partition, None)
            self._next.pop(partition, None)
            self._committed.pop(partition, None)

    def open_count(self) -> int:
        return sum(len(offsets) for offsets in self._open.values())
