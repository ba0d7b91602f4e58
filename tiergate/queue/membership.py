"""Which partition assignor a worker joins a consumer group with.

A consumer group runs one protocol (its assignor's name), chosen when the group forms; a
member offering another is refused with ``InconsistentGroupProtocolError``. Kafka forgets
an empty group's protocol, but Tansu keeps it for good once set: a stack whose data was
written by workers with another ``jobs.kafka.assignment`` (an upgrade from a release that
used ``range``, or a changed setting) could never join again, and its jobs stayed queued.
A rolling upgrade on Kafka meets the same refusal while old members live.

So a worker whose configured assignor the group refuses tries the others in turn and
joins with the one the group runs, says so in its log, and shows both on ``/healthz``.
kafka-python cannot offer an eager and a cooperative assignor in one join (the Java
client's two-step migration), so one is offered at a time. To move a group onto another
assignor on Tansu, give the workers a new ``jobs.kafka.group``: it starts from the oldest
retained record, and pickup skips the jobs that already ended.
"""

from __future__ import annotations

import logging
from typing import Any

from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

log = logging.getLogger("tiergate.membership")

ASSIGNORS: dict[str, Any] = {
    "cooperative-sticky": CooperativeStickyAssignor,
    "range": RangePartitionAssignor,
    "roundrobin": RoundRobinPartitionAssignor,
}


class Membership:
    """One group's assignor for this worker: the configured one until the group refuses it."""

    def __init__(self, group: str, configured: str) -> None:
        if configured not in ASSIGNORS:
            raise ValueError(f"unknown assignor {configured!r}; one of {sorted(ASSIGNORS)}")
        self.group = group
        self.configured = configured
        self._order = [configured] + [name for name in ASSIGNORS if name != configured]
        self._index = 0
        self.refusals = 0

    @property
    def assignor(self) -> str:
        return self._order[self._index]

    def strategy(self) -> list[Any]:
        """kafka-python's ``partition_assignment_strategy`` for the next join."""
        return [ASSIGNORS[self.assignor]]

    def refused(self) -> str:
        """The group refused :attr:`assignor`: the next one to offer."""
        refused = self.assignor
        self._index = (self._index + 1) % len(self._order)
        self.refusals += 1
        log.warning(
            "group %s refused assignor %r (it runs another protocol, set by earlier "
            "members); joining with %r instead of the configured %r. To change a group's "
            "assignor on Tansu, use a new jobs.kafka.group",
            self.group,
            refused,
            self.assignor,
            self.configured,
        )
        return self.assignor

    def state(self) -> dict[str, Any]:
        return {"configured": self.configured, "offered": self.assignor, "refusals": self.refusals}
