"""Token-weighted fairness: the weighted tokens each tenant was served recently on one
group of engines, which orders its admission queue (tiergate.gateway.access.gate).

What is counted is a virtual token counter as in VTC (Sheng et al., "Fairness in Serving
Large Language Models", OSDI 2024): ``prompt_weight`` per prompt token and
``output_weight`` per output token (vLLM's usage), divided by the owner's weight, charged
to the owner (the tenant: a key's ``owner``, shared by a team's keys). The prompt's
estimate is charged when a request is admitted (so a burst admitted between two answers is
counted at once) and corrected with the engine's usage, with the output, when it ends.

Where VTC lifts a tenant that comes back to the least counter of those waiting (so that
credit is not banked), this counts a sliding window instead: what was served in the last
``window_seconds`` (the current period's count plus the previous one's, weighted by how much
of it is still inside the window, as sliding-window rate limits do). A tenant quiet for a
window starts again at zero and is first in line until it has had its share of the
window; no tenant can bank more than a window. The window's periods are wall-clock
periods, so that every replica counts the same ones.

With ``limits.redis_url`` the counts are shared by every gateway replica: each replica adds
what it charged to Redis (``HINCRBYFLOAT`` on one hash per engine group and period) and
reads back the totals of the tenants it has waiting or in flight, every ``sync``
(a second: the gateway's admission clock). Between syncs a replica orders by its last
totals plus what it charged since. Without Redis, or while Redis does not answer, each
replica counts alone.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

from tiergate.accesssettings import FairShareSettings

log = logging.getLogger("tiergate.fairshare")

_PREFIX = "tiergate:served:"


class ServedTokens:
    """One engine group's served-token counts (``group`` names it in Redis)."""

    def __init__(
        self,
        settings: FairShareSettings,
        group: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._s = settings
        self._group = group
        self._clock = clock
        # period number -> owner -> weighted tokens (this replica's view: the totals last
        # read from Redis plus what it charged since, or its own counts alone).
        self._counts: dict[int, dict[str, float]] = {}
        # What was charged since the last sync, still to be added in Redis.
        self._pending: dict[int, dict[str, float]] = {}

    def _period(self, now: float) -> int:
        return math.floor(now / self._s.window_seconds)

    def charge(self, owner: str, tokens: float, weight: float = 1.0) -> None:
        """Count ``tokens`` (already weighted by kind) served to ``owner``."""
        if not self._s.enabled or tokens == 0:
            return
        period = self._period(self._clock())
        amount = tokens / weight
        for book in (self._counts, self._pending):
            counts = book.setdefault(period, {})
            counts[owner] = counts.get(owner, 0.0) + amount
        self._forget(period)

    def served(self, owner: str) -> float:
        """What ``owner`` was served over the last window (its virtual counter)."""
        now = self._clock()
        period = self._period(now)
        inside = 1.0 - (now / self._s.window_seconds - period)  # of the previous period
        current = self._counts.get(period, {}).get(owner, 0.0)
        previous = self._counts.get(period - 1, {}).get(owner, 0.0)
        return current + previous * inside

    def tokens(self, prompt_tokens: float, output_tokens: float) -> float:
        return prompt_tokens * self._s.prompt_weight + output_tokens * self._s.output_weight

    def _forget(self, period: int) -> None:
        for book in (self._counts, self._pending):
            for old in [p for p in book if p < period - 1]:
                del book[old]

    async def sync(self, redis: Any, owners: Iterable[str]) -> None:
        """Add this replica's charges to Redis and read back ``owners``' totals (those
        waiting or in flight here: the only ones its queue orders). Raises what Redis
        raises; the pending charges are then kept for the next sync."""
        if not self._s.enabled:
            return
        period = self._period(self._clock())
        self._forget(period)
        pending, self._pending = self._pending, {}
        wanted = sorted(set(owners))
        try:
            pipe = redis.pipeline(transaction=False)
            ttl = math.ceil(self._s.window_seconds * 3)
            for p, counts in pending.items():
                key = f"{_PREFIX}{self._group}:{p}"
                for owner, amount in counts.items():
                    pipe.hincrbyfloat(key, owner, amount)
                pipe.expire(key, ttl)
            for p in (period - 1, period):
                if wanted:
                    pipe.hmget(f"{_PREFIX}{self._group}:{p}", wanted)
            answers = await pipe.execute()
        except BaseException:
            for p, counts in pending.items():  # not added: added at the next sync instead
                mine = self._pending.setdefault(p, {})
                for owner, amount in counts.items():
                    mine[owner] = mine.get(owner, 0.0) + amount
            raise
        if not wanted:
            return
        for p, values in zip((period - 1, period), answers[-2:], strict=True):
            counts = self._counts.setdefault(p, {})
            since = self._pending.get(p, {})  # charged while the sync was on its way
            for owner, value in zip(wanted, values, strict=True):
                counts[owner] = float(value or 0.0) + since.get(owner, 0.0)
