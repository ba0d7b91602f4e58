"""Each key's share of the worker fleet: no key holds more than ``jobs.fleet_share`` of the
jobs running while another key's jobs wait (issue 33: one key's hundred one-hour jobs
filled every slot for an hour).

Work-conserving: a key alone in the queue uses the whole fleet. At pickup a worker asks
:meth:`FleetShare.over`: with the running jobs ``R`` (this slot free, so the fleet is at
least ``R + 1``), a key already running ``r`` may start another only if ``r + 1 <=
ceil(share * (R + 1))``, or if no other key has a job waiting. A job over its key's share
is not refused: it waits (its record says why, ``error.code`` ``fleet_share``) and its
message comes back through the retry topic after ``jobs.fleet_share_retry_seconds``, so
the partition moves on to the next key's jobs.

What it reads: every job's pending marker (who waits) and running marker
(``running/{owner}/{id}``, written as a job starts and removed as it ends or goes back to
the queue), listed at most every ``jobs.fleet_share_refresh_seconds`` per worker; a key
about to be held back has its running markers checked against their records once, so that
a marker a dead worker left behind does not count. Workers decide on what each listed a
moment ago, so two may both start one job past a share: a bound of the fleet's order, not
an exact count.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable

from tiergate.jobs.state.store import JobStore
from tiergate.protocol import JobStatus


class FleetShare:
    """One worker's view of who runs and who waits, refreshed now and then."""

    def __init__(
        self,
        store: JobStore,
        share: float,
        refresh_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._share = share
        self._refresh = refresh_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._read_at = -math.inf
        self._running: dict[str, set[str]] = {}
        self._mine: dict[str, set[str]] = {}  # started by this worker, not ended yet
        self._waiting: Counter[str] = Counter()

    def admit(self, owner: str, job_id: str) -> str | None:
        """Why ``owner`` may not start ``job_id`` now; None: it may, and the job is counted
        as started here at once (:meth:`ended` when it ends, or does not start after all),
        so that this worker's other slots, deciding at the same moment, see it."""
        with self._lock:
            why = self._over(owner)
            if why is None:
                self._started(owner, job_id)
            return why

    def _over(self, owner: str) -> str | None:
        if self._share >= 1:
            return None
        self._read()
        mine = len(self._running.get(owner, ()))
        total = sum(len(ids) for ids in self._running.values())
        cap = max(1, math.ceil(self._share * (total + 1)))
        others = any(n > 0 for key, n in self._waiting.items() if key != owner)
        if mine + 1 <= cap or not others:
            return None
        mine = self._verified(owner)
        total = sum(len(ids) for ids in self._running.values())
        cap = max(1, math.ceil(self._share * (total + 1)))
        if mine + 1 <= cap:
            return None
        return (
            f"waiting: this key runs {mine} of the fleet's {total} running jobs, its "
            f"share while other keys' jobs wait (jobs.fleet_share: {self._share:g})"
        )

    def _started(self, owner: str, job_id: str) -> None:
        # In every listing until it ends here: its marker may not be listed yet.
        self._mine.setdefault(owner, set()).add(job_id)
        self._running.setdefault(owner, set()).add(job_id)
        self._waiting[owner] = max(0, self._waiting[owner] - 1)

    def ended(self, owner: str, job_id: str) -> None:
        with self._lock:
            self._mine.get(owner, set()).discard(job_id)
            self._running.get(owner, set()).discard(job_id)

    def _read(self) -> None:
        if self._clock() - self._read_at < self._refresh:
            return
        running = self._store.running_by_owner()
        pending: Counter[str] = Counter(owner for owner, _ in self._store.pending())
        for owner, ids in self._mine.items():
            running.setdefault(owner, set()).update(ids)
        self._running = running
        self._waiting = Counter({key: n - len(running.get(key, ())) for key, n in pending.items()})
        self._read_at = self._clock()

    def _verified(self, owner: str) -> int:
        """``owner``'s running markers whose records say so; the others are removed."""
        live = set()
        for job_id in self._running.get(owner, set()):
            job = self._store.get(job_id)
            if job_id in self._mine.get(owner, ()) or (
                job is not None and job.status is JobStatus.IN_PROGRESS
            ):
                live.add(job_id)
            else:
                self._store.unmark_running(owner, job_id)
        self._running[owner] = live
        return len(live)
