"""The patient lane: how many of a tier's slots patient work may hold while interactive
callers share its engines.

Patient work is flex requests and agent jobs' model calls (OpenAI batch lines among them).
The engines run every admitted request in the same steps, so each patient request in
flight lengthens every interactive stream's time per output token (TPOT); the admission
queue's urgency order cannot help once a request is admitted. So the lane's limit is set
from what interactive callers see, as a congestion window is (additive increase,
multiplicative decrease):

- **reference**: the TPOT of interactive streams that ran with no more than the floor
  (``min_concurrent``) of patient requests in flight: the median of the last
  ``reference_samples``. Until there is one the limit sits at the floor, so that one is
  measured.
- every ``adjust_seconds`` in which interactive streams ended, their median TPOT over the
  reference is the **slowdown**: over ``target_slowdown`` the limit halves (not below the
  floor); under it, and with the lane full, it grows by an eighth (at least one).
- with no interactive stream for ``quiet_seconds`` the limit is lifted to
  ``max_concurrent``: patient work fills what interactive callers leave.

Requests already admitted keep their slots when the limit falls; only the next ones wait.
Each gateway replica governs its own patient requests from its own interactive streams.
Where both tiers are served by the same engines they share one lane.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable

from tiergate.gateway.access.gate import Gate
from tiergate.settings import PatientAdmission


class PatientLane:
    """One engine group's patient lane: its gate and the limit's controller."""

    def __init__(
        self, settings: PatientAdmission, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._s = settings
        self._clock = clock
        self.gate = Gate(settings.max_concurrent, settings.max_queue)
        self._reference: deque[float] = deque(maxlen=settings.reference_samples)
        self._window: list[float] = []
        self._window_started = clock()
        self._last_interactive = float("-inf")
        # The last window's median TPOT over the reference (None before there is one).
        self.slowdown: float | None = None

    @property
    def limit(self) -> int:
        return self.gate.capacity

    def quiet_floor(self) -> int:
        """How many patient requests an interactive stream may share the engines with and
        still count as the reference."""
        return self._s.min_concurrent

    def started(self) -> int:
        """What an interactive stream notes as it is admitted (see :meth:`observe`)."""
        return self.gate.active

    def observe(self, tpot: float, active_at_start: int) -> None:
        """An interactive stream's TPOT, and the patient requests in flight when it was
        admitted (:meth:`started`) and now: with no more than the floor at both, it is a
        reference sample."""
        if not self._s.adaptive:
            return
        now = self._clock()
        self._last_interactive = now
        floor = self._s.min_concurrent
        if active_at_start <= floor and self.gate.active <= floor:
            self._reference.append(tpot)
        self._window.append(tpot)
        if now - self._window_started >= self._s.adjust_seconds:
            self._adjust(now)

    def tick(self) -> None:
        """Called every so often: lifts the limit once interactive callers are quiet."""
        if not self._s.adaptive:
            return
        if self._clock() - self._last_interactive >= self._s.quiet_seconds:
            self._window.clear()
            if self.limit != self._s.max_concurrent:
                self.gate.resize(self._s.max_concurrent)

    def _adjust(self, now: float) -> None:
        samples, self._window, self._window_started = self._window, [], now
        floor, ceiling = self._s.min_concurrent, self._s.max_concurrent
        if not self._reference:
            self.gate.resize(floor)
            return
        self.slowdown = statistics.median(samples) / statistics.median(self._reference)
        if self.slowdown > self._s.target_slowdown:
            self.gate.resize(max(floor, self.limit // 2))
        elif self.gate.active >= self.limit or self.gate.queued:
            self.gate.resize(min(ceiling, self.limit + max(1, self.limit // 8)))
