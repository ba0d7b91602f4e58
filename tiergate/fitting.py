"""The fast tier while the local stack fits it beside a serving gateway (issue 53).

``tiergate up`` opens the gateway as soon as the standard engine answers. The fast tier is
then fitted beside it (the tuner's decision measured or reused, the checkpoint built, the
engine started, its parity judged where it was never judged) and joins the running
gateway when it is proven. Until then the tier policy serves the fast tier's requests on
the standard tier with the reason ``fitting`` (or ``unfitted`` when the fitting failed) and
``GET /v1/tiers`` shows :meth:`Fitting.describe`: the phase, its progress and, while the
tuner runs, the tuner's own progress file (candidate i of n, the figures so far, the time
it estimates is left).

One :class:`Fitting` per stack. The stack's fitting thread writes it; the gateway reads it
from its event loop and applies a :class:`Joined` once (its pools take the new endpoints,
health-checked before the policy sends anything there), then marks it joined: a request in
flight keeps the endpoint it was given, and no request is ever sent to an engine the
fitting has not proven.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tiergate.tiers import Tier

# "tuning": the tuner measures candidates; "starting": the chosen recipe's engine starts;
# "judging": its parity with the standard tier is judged once started; "joining": the
# gateway is taking it in; "joined": it serves; "failed": it will not join this run.
Phase = Literal["tuning", "starting", "judging", "joining", "joined", "failed"]


@dataclass(frozen=True)
class Joined:
    """Both tiers' pools once the fast tier is proven, and how /v1/tiers describes them."""

    endpoints: Mapping[Tier, list[str]]
    engine_modes: Mapping[Tier, str] = field(default_factory=dict)
    shared_engines: bool = False
    engine_count: int = 2


def read_progress(path: Path | None, now: float | None = None) -> dict[str, Any] | None:
    """The tuner's progress file (tiergate.tuning.tuner), or None when absent or torn. The
    tuner writes it at each step; read later, its estimate of the time left counts down
    from when it was written (``updated_seconds_ago``), and so does ``elapsed_seconds``
    count up."""
    if path is None:
        return None
    try:
        written = path.stat().st_mtime
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(loaded, dict):
        return None
    age = max(0.0, (time.time() if now is None else now) - written)
    loaded["updated_seconds_ago"] = round(age, 1)
    for name, sign in (("estimated_seconds_left", -1), ("elapsed_seconds", 1)):
        if isinstance(loaded.get(name), int | float):
            loaded[name] = round(max(0.0, loaded[name] + sign * age), 0)
    return loaded


def write_progress(path: Path, body: Mapping[str, Any]) -> None:
    """Replace the progress file in one rename, so that a reader never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.partial")
    tmp.write_text(json.dumps(dict(body)) + "\n")
    tmp.replace(path)


class Fitting:
    """The fast tier's fitting, shared by the stack's fitting thread and the gateway."""

    def __init__(self, progress_file: Path | None, clock: Callable[[], float] = time.time) -> None:
        self._progress_file = progress_file
        self._clock = clock
        self._lock = threading.Lock()
        self._started = clock()
        self._phase: Phase = "tuning"
        self._detail = "the fast tier is being fitted to this machine"
        self._since = self._started
        self._pending: Joined | None = None
        self._joined: Joined | None = None

    # -- the fitting thread ------------------------------------------------------------------

    def enter(self, phase: Phase, detail: str) -> None:
        with self._lock:
            if self._phase in ("joined", "failed"):
                return
            self._phase, self._detail, self._since = phase, detail, self._clock()

    def join(self, joined: Joined) -> None:
        """The fast tier is proven: the gateway takes ``joined`` in (:meth:`take_join`)."""
        with self._lock:
            self._pending = joined
            self._phase, self._detail, self._since = "joining", "joining the gateway", self._clock()

    def fail(self, reason: str) -> None:
        with self._lock:
            self._phase, self._detail, self._since = "failed", reason, self._clock()

    # -- the gateway ---------------------------------------------------------------------------

    def take_join(self) -> Joined | None:
        """The join to apply, once (None while there is none)."""
        with self._lock:
            pending, self._pending = self._pending, None
            return pending

    def mark_joined(self, joined: Joined) -> None:
        """Called once the gateway's pools hold ``joined``'s endpoints, checked."""
        with self._lock:
            self._joined = joined
            self._phase, self._detail = "joined", "the fast tier serves"
            self._since = self._clock()

    @property
    def joined(self) -> Joined | None:
        return self._joined

    def unready_reason(self) -> str | None:
        """Why the fast tier's requests go to the standard tier now: ``fitting`` while it is
        fitted, ``unfitted`` once that failed; None once it has joined."""
        with self._lock:
            if self._joined is not None:
                return None
            return "unfitted" if self._phase == "failed" else "fitting"

    def describe(self) -> dict[str, Any]:
        """What ``GET /v1/tiers`` shows of it under ``fitting``."""
        with self._lock:
            now = self._clock()
            body: dict[str, Any] = {
                "state": self._phase,
                "detail": self._detail,
                "started_at": int(self._started),
                "elapsed_seconds": round(now - self._started, 1),
                "phase_seconds": round(now - self._since, 1),
            }
            tuning = self._phase == "tuning"
        if tuning:
            body["tuning"] = read_progress(self._progress_file)
        return body
