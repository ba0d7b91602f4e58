"""The patient lane: how many of a tier's slots patient work may hold while interactive
callers share its engines.

Patient work is flex requests and agent jobs' model calls (OpenAI batch lines among them).
The engines run every admitted request in the same steps, so each patient request in
flight lengthens every interactive stream's time per output token (TPOT); the admission
queue's urgency order cannot help once a request is admitted. So the lane's limit is set
from what interactive callers see, as a congestion window is (additive increase,
multiplicative decrease):

- **reference**: what interactive streams saw when they ran with no more than the floor
  (``min_concurrent``) of patient requests in flight: the median time per output token of
  the last ``reference_samples``, and the median time to first token of as many in each
  prompt size (a power of two of estimated tokens: a long prompt's first token comes later
  whatever runs beside it). Until there is one the limit sits at the floor, so that one is
  measured.
- a stream's **slowdown** is its TPOT over the reference, or with ``judge_ttft`` (off by
  default: settings.py says why) the larger of that and its TTFT over its prompt size's
  (where that size has one). Every ``adjust_seconds`` in which interactive streams ended,
  their median slowdown decides: over ``target_slowdown`` the limit is cut to 0.7 of
  itself, or of the requests in flight where fewer (not below the floor); under it, and
  with the lane full, it grows by an eighth (at least one).
- with no interactive stream for ``quiet_seconds`` the limit is lifted to
  ``max_concurrent``: patient work fills what interactive callers leave.

Each tenant has one voice: the window's slowdown is the median of each owner's median,
and the reference the median of each owner's median TPOT (and TTFT) among its samples, so
a tenant that sends many answers of its own choosing (short, on a faster path, or timed
as it likes) moves the lane no more than one that sends a few.

Interactive answers that are not streamed count too (timed on the engine's stream the
gateway reads them from), and a stream the client read slowly does not
(tiergate.gateway.openai.timing). Requests already admitted keep their slots when the
limit falls; only the next ones wait.
Each gateway replica governs its own patient requests from its own interactive streams.
Where both tiers are served by the same engines they share one lane.

The same controller sets each tier's whole limit (flow control, ``admission.flow``): given
the tier's gate, and started at its ceiling rather than its floor (``measure_first``
False), since holding every request to the floor until a reference exists would queue a
fresh gateway's first burst.
"""

from __future__ import annotations

import statistics
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from tiergate.accesssettings import PatientAdmission
from tiergate.gateway.access.gate import Gate

# A limit over the target is cut to this share of itself (as CUBIC cuts a window: 0.5
# swung the limit from 16 to 8 and back, with a burst of slow samples after each rise).
_DECREASE = 0.7
# The tenants a reference keeps samples of (the most recent ones): bounds its memory and
# the work of its median whatever the number of keys.
_REFERENCE_OWNERS = 64


class PatientLane:
    """One engine group's patient lane: its gate and the limit's controller."""

    def __init__(
        self,
        settings: PatientAdmission,
        clock: Callable[[], float] = time.monotonic,
        *,
        gate: Gate | None = None,
        measure_first: bool = True,
    ) -> None:
        self._s = settings
        self._clock = clock
        self._measure_first = measure_first
        self.gate = gate or Gate(settings.max_concurrent, settings.max_queue)
        self._tpot_ref = _Reference(settings.reference_samples)
        self._ttft_ref: dict[int, _Reference] = {}
        self._window: dict[str, list[float]] = {}
        self._window_started = clock()
        self._last_interactive = float("-inf")
        # The last window's median slowdown (None before there is a reference).
        self.slowdown: float | None = None

    @property
    def limit(self) -> int:
        return self.gate.capacity

    def started(self) -> int:
        """What an interactive stream notes as it is admitted (see :meth:`observe`)."""
        return self.gate.active

    def observe(
        self,
        tpot: float,
        ttft: float,
        prompt_tokens: int,
        active_at_start: int,
        owner: str = "",
    ) -> None:
        """An interactive stream's time per output token and to its first token, its prompt's
        estimated tokens, the patient requests in flight when it was admitted
        (:meth:`started`): with no more than the floor then and now, it is a reference; and
        the tenant (``owner``) whose stream it was."""
        if not self._s.adaptive:
            return
        now = self._clock()
        self._last_interactive = now
        floor = self._s.min_concurrent
        size = max(1, prompt_tokens).bit_length()
        if active_at_start <= floor and self.gate.active <= floor:
            self._tpot_ref.add(owner, tpot)
            ttfts = self._ttft_ref.setdefault(size, _Reference(self._s.reference_samples))
            ttfts.add(owner, ttft)
        first = None
        if self._s.judge_ttft and size in self._ttft_ref:
            first = _over(ttft, self._ttft_ref[size].value())
        slowdown = _worst([_over(tpot, self._tpot_ref.value()), first])
        if slowdown is not None:
            self._window.setdefault(owner, []).append(slowdown)
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
        voices, self._window, self._window_started = self._window, {}, now
        floor, ceiling = self._s.min_concurrent, self._s.max_concurrent
        if not voices:
            if self._tpot_ref.value() is None and self._measure_first:
                self.gate.resize(floor)  # no reference yet: measure one
            return
        self.slowdown = statistics.median(statistics.median(v) for v in voices.values())
        if self.slowdown > self._s.target_slowdown:
            # Cut from what is in flight where that is under the limit: a cut above it
            # changes nothing (a tier's limit starts at its ceiling, far above its load).
            base = min(self.limit, max(self.gate.active, floor))
            self.gate.resize(max(floor, int(base * _DECREASE)))
        elif self.gate.active >= self.limit or self.gate.queued:
            self.gate.resize(min(ceiling, self.limit + max(1, self.limit // 8)))


class _Reference:
    """A reference time: each tenant's last ``samples`` (of the ``owners`` tenants heard
    from last), and as its value the median of each tenant's median, so that no tenant
    fills it alone."""

    def __init__(self, samples: int, owners: int = _REFERENCE_OWNERS) -> None:
        self._samples = samples
        self._owners = owners
        self._by_owner: OrderedDict[str, deque[float]] = OrderedDict()
        self._value: float | None = None

    def add(self, owner: str, sample: float) -> None:
        kept = self._by_owner.pop(owner, None) or deque(maxlen=self._samples)
        kept.append(sample)
        self._by_owner[owner] = kept  # the most recent tenant last
        if len(self._by_owner) > self._owners:
            self._by_owner.popitem(last=False)
        self._value = statistics.median(statistics.median(v) for v in self._by_owner.values())

    def value(self) -> float | None:
        return self._value


def _over(value: float, reference: float | None) -> float | None:
    return value / reference if reference else None


def _worst(ratios: list[float | None]) -> float | None:
    known = [r for r in ratios if r is not None]
    return max(known) if known else None
