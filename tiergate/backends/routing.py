"""Choosing an endpoint: least load, with prefix affinity that yields to load."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from tiergate.backends.endpoint import Endpoint


class PrefixAffinity:
    """A bounded LRU map from a prompt-prefix key to the endpoint that last served it."""

    def __init__(self, max_entries: int) -> None:
        self._max = max_entries
        self._map: OrderedDict[int, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._map)

    def get(self, key: int) -> str | None:
        url = self._map.get(key)
        if url is not None:
            self._map.move_to_end(key)
        return url

    def put(self, key: int, url: str) -> None:
        self._map[key] = url
        self._map.move_to_end(key)
        while len(self._map) > self._max:
            self._map.popitem(last=False)

    def forget(self, url: str) -> None:
        for key in [k for k, v in self._map.items() if v == url]:
            del self._map[key]


class LoadAwareRouter:
    """Least-score choice; an affine endpoint wins while within ``load_slack`` of the best."""

    def __init__(self, affinity: PrefixAffinity, load_slack: float) -> None:
        self.affinity = affinity
        self._slack = load_slack
        self._turn = 0

    def choose(self, candidates: Sequence[Endpoint], prefix_key: int | None) -> Endpoint:
        if not candidates:
            raise ValueError("no candidates")
        if len(candidates) == 1:  # one endpoint: no ordering or scores to compare
            only = candidates[0]
            if prefix_key is not None:
                self.affinity.put(prefix_key, only.url)
            return only
        # Rotate the starting point so that equal scores spread over endpoints.
        self._turn = (self._turn + 1) % len(candidates)
        ordered = list(candidates[self._turn :]) + list(candidates[: self._turn])
        best = min(ordered, key=Endpoint.score)
        if prefix_key is None:
            return best
        preferred_url = self.affinity.get(prefix_key)
        chosen = best
        if preferred_url is not None and preferred_url != best.url:
            for ep in candidates:
                if ep.url == preferred_url and ep.score() <= best.score() + self._slack:
                    chosen = ep
                    break
        self.affinity.put(prefix_key, chosen.url)
        return chosen
