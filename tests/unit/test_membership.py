"""The assignor a worker offers a group: the configured one, then each other in turn."""

from __future__ import annotations

import pytest

from tiergate.queue.membership import ASSIGNORS, Membership


def test_the_configured_assignor_is_offered_first_then_each_other_in_turn() -> None:
    member = Membership("workers", "range")
    assert member.assignor == "range"
    assert member.strategy() == [ASSIGNORS["range"]]
    offered = [member.refused() for _ in range(len(ASSIGNORS))]
    assert sorted(offered[:-1]) == sorted(set(ASSIGNORS) - {"range"})
    assert offered[-1] == "range"  # round again: the group may have moved back
    assert member.state() == {"configured": "range", "offered": "range", "refusals": 3}


def test_an_unknown_assignor_is_refused_at_once() -> None:
    with pytest.raises(ValueError, match="unknown assignor"):
        Membership("workers", "sticky")
