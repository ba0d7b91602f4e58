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

A create whose size is known only once it has looked (an OpenAI batch's lines and
estimated tokens, after its input file is read) also :meth:`Ticket.claim` s it, and counts
what every other ticket of its key has claimed, whether taken before or after its own: of
two creates that check at once, the one that claims last sees the other's claim.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager


class Reservations:
    """The tickets each key holds on one replica, in the order they were taken."""

    def __init__(self) -> None:
        self._numbers = itertools.count()
        # Per key: each held ticket's number and what it claimed (lines, tokens).
        self._held: dict[str, dict[int, tuple[int, int]]] = {}

    @contextmanager
    def ticket(self, owner: str) -> Iterator[Ticket]:
        number = next(self._numbers)
        held = self._held.setdefault(owner, {})
        held[number] = (0, 0)
        try:
            yield Ticket(self, owner, number)
        finally:
            del held[number]
            if not held:
                self._held.pop(owner, None)

    def ahead_of(self, owner: str, number: int) -> int:
        return sum(1 for n in self._held.get(owner, ()) if n < number)

    def claim(self, owner: str, number: int, lines: int, tokens: int) -> tuple[int, int]:
        """Record ticket ``number``'s claim; what the key's other tickets claimed."""
        held = self._held[owner]
        held[number] = (lines, tokens)
        others = [c for n, c in held.items() if n != number]
        return sum(c[0] for c in others), sum(c[1] for c in others)


class Ticket:
    """One create's place: :meth:`ahead` is how many of its key's creates went first."""

    def __init__(self, reservations: Reservations, owner: str, number: int) -> None:
        self._reservations = reservations
        self._owner = owner
        self._number = number

    def ahead(self) -> int:
        return self._reservations.ahead_of(self._owner, self._number)

    def claim(self, lines: int, tokens: int) -> tuple[int, int]:
        """This create's size; the (lines, tokens) its key's other creates have claimed."""
        return self._reservations.claim(self._owner, self._number, lines, tokens)
