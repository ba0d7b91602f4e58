"""Places under a per-key cap held while a create is on its way to storage.

A cap checked against what the store holds (a key's unfinished jobs, its active batches)
and then recorded lets parallel creates through together: a hundred at once all saw 99.
A create takes a :class:`Ticket` before it looks, and counts, besides what the store
holds, the tickets of the same key taken before its own and not yet returned; it returns
its ticket once its record (whose marker the store then counts) is written or given up.
The store's count may then already include an earlier ticket's record, so at the cap's
edge a create may be refused that one more could have taken, never the other way round.
This holds within one gateway replica; between replicas, a create's marker is its first
write (tiergate.jobs.state.store), which shortens the window to one storage round trip.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager


class Reservations:
    """The tickets each key holds on one replica, in the order they were taken."""

    def __init__(self) -> None:
        self._numbers = itertools.count()
        self._held: dict[str, list[int]] = {}

    @contextmanager
    def ticket(self, owner: str) -> Iterator[Ticket]:
        number = next(self._numbers)
        held = self._held.setdefault(owner, [])
        held.append(number)
        try:
            yield Ticket(self, owner, number)
        finally:
            held.remove(number)
            if not held:
                self._held.pop(owner, None)

    def ahead_of(self, owner: str, number: int) -> int:
        return sum(1 for n in self._held.get(owner, ()) if n < number)


class Ticket:
    """One create's place: :meth:`ahead` is how many of its key's creates went first."""

    def __init__(self, reservations: Reservations, owner: str, number: int) -> None:
        self._reservations = reservations
        self._owner = owner
        self._number = number

    def ahead(self) -> int:
        return self._reservations.ahead_of(self._owner, self._number)
