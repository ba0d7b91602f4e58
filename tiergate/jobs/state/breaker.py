"""Circuit breakers per environment: consecutive infrastructure failures in one environment
stop its jobs quickly until a probe job shows it works again.

Where the state lives: one small JSON object per environment in the job store
(``<prefix>breakers/<environment>.json``), shared by every worker without another service.
Every change is a conditional write: a first record with ``If-None-Match: *``, later ones
with ``If-Match: <the ETag read>``. A writer that loses the race reads again and re-applies
its change to the winner's state, so two workers never lose an update. Each record carries
a ``revision`` that grows by one, so two records never share a content (and an ETag).

States and transitions:

- ``closed``: jobs run. An infrastructure failure adds one to ``failures``; at
  ``jobs.breaker.failures_to_open`` the breaker opens. A job that shows the environment
  works (completed, or its verifier ran and judged a wrong answer) sets ``failures`` to 0.
- ``open``: a job picked up fails at once (``environment_unavailable``) without a sandbox.
  After ``cooldown_seconds`` the first job picked up claims the probe (a conditional
  write, so exactly one wins) and the breaker is ``half_open``.
- ``half_open``: only the probe job runs; every other job fails fast. The probe working
  closes the breaker, an infrastructure failure of the probe opens it again (a new
  cool-down), any other ending (cancelled, timed out, retried, model errors) hands the
  probe back (``open``, cool-down already over: the next job probes). A probe whose job
  already has a terminal record (its worker died after finishing it, or it was cancelled
  while waiting for a retry) is taken over by the next job; a probe job that is redelivered
  (its worker died mid-run) is let through again.
- ``held``: an operator opened the breaker (``tiergate env breaker open NAME``): it stays
  open with no probe until an operator closes it.

What counts as a failure of the environment (the environment, not the job or the model,
broke), and so towards ``failures_to_open``:

- the sandbox failing to start (``sandbox_start``: the environment cannot be fetched or
  unpacked, the sandbox or its cgroup cannot be made): each one counts;
- a job's own commands failing: its setup command exits non-zero (stage ``setup``) or its
  verifier crashes (``verifier``: exit status 126 or more, i.e. not executable, not found,
  or killed by a signal (128+n, or a negative status), and not a timeout; an exit status of
  1 is a wrong answer). These are written by the job's owner, who can make them fail at
  will, so **each owner counts once per run of failures**: the owners already counted are
  kept in the record (``owners``), and a further failure of the same owner's commands
  changes nothing (as a probe, it hands the probe back, like a job without a verdict).
  One tenant alone therefore moves the count by at most one and never opens a breaker
  that other tenants share; setup failing for several owners does.

The model's wrong answers, max_steps and timeouts, cancellations and model endpoint errors
(retried as transient) do not count. A job refused by an open breaker is told the state and
when the next probe may run, never what failed (that names another tenant's command): the
record's ``reason`` is for operators (``tiergate env breaker list``).

Metrics: a worker exports what it last read or wrote (the sweeper reads every breaker every
15 s, so an idle worker's gauge follows too); transitions are counted by the process that
made them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pydantic import BaseModel

from tiergate.jobs.state.store import JobStore, StorageError
from tiergate.jobsettings import JobsSettings
from tiergate.protocol import ENVIRONMENT_PATTERN

log = logging.getLogger("tiergate.breaker")

State = Literal["closed", "open", "half_open"]
# What a finished job says about its environment: it worked, it broke (the stage), or
# nothing (cancelled, timed out, model errors...).
FailureKind = Literal["ok", "neutral", "setup", "sandbox_start", "verifier"]
INFRA_STAGES = ("setup", "sandbox_start", "verifier")
# The stages whose commands the job's owner wrote: counted once per owner (see above).
OWNERS_STAGES = ("setup", "verifier")
_MAX_TRIES = 50


def worker_identity() -> str:
    return f"worker {socket.gethostname()}:{os.getpid()}"


class Breaker(BaseModel):
    """One environment's breaker as stored."""

    environment: str
    state: State = "closed"
    failures: int = 0
    opened_at: float | None = None
    held: bool = False
    probe: str | None = None
    probe_started_at: float | None = None
    changed_by: str = ""
    changed_at: float = 0.0
    reason: str = ""
    revision: int = 0
    # The owners whose own commands (setup, verifier) failed in this run of failures.
    owners: list[str] = []

    def next_probe_at(self, cooldown: float) -> float | None:
        if self.state != "open" or self.held or self.opened_at is None:
            return None
        return self.opened_at + cooldown


@dataclass(frozen=True)
class BreakerAdmission:
    allowed: bool
    probe: bool
    breaker: Breaker
    message: str = ""


def _stamp(at: float | None) -> str:
    if at is None:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


class BreakerMetrics(Protocol):
    """Where a board reports what it sees (a worker's metrics are one)."""

    def breaker_state(self, environment: str, state: str) -> None: ...
    def breaker_transition(self, environment: str, to: str) -> None: ...
    def infra_failure(self, environment: str, stage: str) -> None: ...


class BreakerBoard:
    """Reads and changes the breakers in the job store; one per worker (or per command)."""

    def __init__(
        self,
        store: JobStore,
        settings: JobsSettings,
        metrics: BreakerMetrics | None = None,
        *,
        identity: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._objects = store.objects
        self._settings = settings.breaker
        self._metrics = metrics
        self._identity = identity or worker_identity()
        self._clock = clock
        self._root = f"{store.objects.prefix}breakers/"

    @property
    def enabled(self) -> bool:
        return self._settings.enabled

    # -- storage ----------------------------------------------------------------------------

    def _key(self, environment: str) -> str:
        return f"{self._root}{environment}.json"

    def read(self, environment: str) -> tuple[Breaker, str | None]:
        """The breaker and its ETag (None: no record yet, i.e. closed with no failures)."""
        tagged = self._objects.get_tagged(self._key(environment))
        if tagged is None:
            breaker, etag = Breaker(environment=environment), None
        else:
            breaker, etag = Breaker.model_validate_json(tagged[0]), tagged[1]
        self._observe(breaker)
        return breaker, etag

    def _write(self, breaker: Breaker, etag: str | None) -> bool:
        """Write if nobody changed it since it was read; False when someone did."""
        return self._objects.put_if(
            self._key(breaker.environment),
            breaker.model_dump_json().encode(),
            etag,
            content_type="application/json",
        )

    def _change(
        self,
        environment: str,
        change: Callable[[Breaker], Breaker | None],
        seen: tuple[Breaker, str | None] | None = None,
    ) -> tuple[Breaker, Breaker]:
        """Apply ``change`` (None: nothing to do) with compare-and-swap until it sticks;
        returns (before, after). ``seen``: what :meth:`read` just returned, used for the
        first try (a stale one only costs a failed write and a fresh read)."""
        for _ in range(_MAX_TRIES):
            before, etag = seen if seen is not None else self.read(environment)
            seen = None
            after = change(before.model_copy(deep=True))
            if after is None:
                return before, before
            after.revision = before.revision + 1
            after.changed_at = self._clock()
            after.changed_by = after.changed_by or self._identity
            if self._write(after, etag):
                if after.state != before.state:
                    log.warning(
                        "environment %s: breaker %s -> %s (%s, by %s)",
                        environment,
                        before.state,
                        after.state,
                        after.reason,
                        after.changed_by,
                    )
                    if self._metrics is not None:
                        self._metrics.breaker_transition(environment, after.state)
                self._observe(after)
                return before, after
        raise StorageError("object storage: a breaker kept changing under this writer")

    def _observe(self, breaker: Breaker) -> None:
        if self._metrics is not None:
            self._metrics.breaker_state(breaker.environment, breaker.state)

    def list(self) -> list[Breaker]:
        found = []
        for key in self._objects.keys(self._root):
            name = key.removeprefix(self._root).removesuffix(".json")
            found.append(self.read(name)[0])
        return found

    def refresh(self) -> None:
        """Copy every stored breaker's state into this worker's gauge."""
        if self.enabled:
            self.list()

    # -- the worker's side ------------------------------------------------------------------

    def admit(
        self, environment: str, job_id: str, seen: tuple[Breaker, str | None] | None = None
    ) -> BreakerAdmission:
        """May ``job_id`` run in ``environment`` now? Claims the probe when one is due.
        ``seen``: the breaker as :meth:`read` returned it moments ago (the worker reads it
        with the pickup's other reads); a closed one admits without another round trip."""
        if not self.enabled:
            return BreakerAdmission(True, False, Breaker(environment=environment))
        cooldown = self._settings.cooldown_seconds
        decided: dict[str, bool] = {}

        def change(b: Breaker) -> Breaker | None:
            decided.clear()
            now = self._clock()
            if b.state == "closed":
                decided["allowed"] = True
                return None
            if b.state == "half_open":
                if b.probe == job_id:  # the probe, redelivered
                    decided.update(allowed=True, probe=True)
                    return None
                started = b.probe_started_at or now
                overdue = now - started > self._settings.probe_seconds
                if b.probe is None or (not overdue and not self._probe_ended(b.probe)):
                    return None
            elif b.held or b.opened_at is None or now < b.opened_at + cooldown:
                return None
            b.state, b.probe, b.probe_started_at = "half_open", job_id, now
            b.changed_by, b.reason = self._identity, f"probe {job_id}"
            decided.update(allowed=True, probe=True)
            return b

        after = self._change(environment, change, seen)[1]
        if decided.get("allowed"):
            return BreakerAdmission(True, bool(decided.get("probe")), after)
        return BreakerAdmission(False, False, after, self._refusal(after, cooldown))

    def _probe_ended(self, job_id: str) -> bool:
        try:
            return self._store.final(job_id) is not None
        except StorageError:
            return False

    def _refusal(self, b: Breaker, cooldown: float) -> str:
        if b.held:
            when = "when an operator closes it (tiergate env breaker close)"
        elif b.state == "half_open":
            # Not the probe's id: that is another tenant's job.
            when = "when the probe job now running ends"
        else:
            when = f"after {_stamp(b.next_probe_at(cooldown))}"
        state = "held open by an operator" if b.held else b.state.replace("_", "-")
        return (
            f"environment {b.environment!r} is unavailable: its circuit breaker is {state} "
            f"after {b.failures} consecutive infrastructure failures; the next "
            f"probe job may run {when}"
        )

    def record(
        self, environment: str, job_id: str, verdict: FailureKind, detail: str = "", owner: str = ""
    ) -> None:
        """What a finished job (or one handed back for retry) of ``owner`` says about its
        environment."""
        if not self.enabled:
            return
        threshold = self._settings.failures_to_open
        if verdict in INFRA_STAGES and self._metrics is not None:
            self._metrics.infra_failure(environment, verdict)

        def change(b: Breaker) -> Breaker | None:
            probe = b.state == "half_open" and b.probe == job_id
            now = self._clock()
            b.changed_by = self._identity
            if verdict == "ok":
                if probe:
                    b.state, b.failures, b.opened_at, b.owners = "closed", 0, None, []
                    b.probe = b.probe_started_at = None
                    b.reason = f"probe {job_id} worked"
                    return b
                if b.state == "closed" and (b.failures or b.owners):
                    b.failures, b.owners, b.reason = 0, [], f"job {job_id} worked"
                    return b
                return None
            if verdict in OWNERS_STAGES and owner in b.owners:
                verdict_now: FailureKind = "neutral"  # this owner's commands counted already
            else:
                verdict_now = verdict
            if verdict_now == "neutral":
                if probe:
                    b.state, b.probe, b.probe_started_at = "open", None, None
                    b.reason = f"probe {job_id} ended without a verdict; next job probes"
                    return b
                return None
            # An infrastructure failure.
            if verdict in OWNERS_STAGES:
                b.owners = [*b.owners, owner]
            if probe:
                b.state, b.opened_at, b.failures = "open", now, b.failures + 1
                b.probe = b.probe_started_at = None
                b.reason = f"probe {job_id} failed: {verdict}: {detail}"[:300]
                return b
            if b.state != "closed":
                return None  # a job admitted before it opened: already open
            b.failures += 1
            b.reason = f"{verdict}: {detail}"[:300]
            if b.failures >= threshold:
                b.state, b.opened_at = "open", now
            return b

        self._change(environment, change)

    # -- the operator's side ----------------------------------------------------------------

    def force_open(self, environment: str, by: str) -> Breaker:
        """Open and hold: no probe runs until :meth:`force_close`."""

        def change(b: Breaker) -> Breaker:
            b.state, b.held, b.opened_at = "open", True, self._clock()
            b.probe = b.probe_started_at = None
            b.changed_by, b.reason = by, "opened by an operator"
            return b

        return self._change(environment, change)[1]

    def force_close(self, environment: str, by: str) -> Breaker:
        def change(b: Breaker) -> Breaker:
            b.state, b.held, b.failures, b.opened_at = "closed", False, 0, None
            b.owners = []
            b.probe = b.probe_started_at = None
            b.changed_by, b.reason = by, "closed by an operator"
            return b

        return self._change(environment, change)[1]


def describe(b: Breaker, cooldown: float) -> dict[str, Any]:
    """A breaker as the operator command prints it."""
    out: dict[str, Any] = b.model_dump(mode="json")
    out["next_probe_at"] = b.next_probe_at(cooldown)
    return out


# -- the operator command (tiergate env breaker ...) ----------------------------------------


def operator_identity() -> str:
    user = "unknown"
    with contextlib.suppress(Exception):
        import getpass

        user = getpass.getuser()
    return f"operator {user}@{socket.gethostname()}"


def command(settings: JobsSettings, action: str, name: str | None = None) -> list[dict[str, Any]]:
    """``list``, ``open NAME`` or ``close NAME`` on the store the settings name."""
    store = JobStore(settings.storage)
    board = BreakerBoard(store, settings, identity=operator_identity())
    cooldown = settings.breaker.cooldown_seconds
    if action == "list":
        return [describe(b, cooldown) for b in board.list()]
    if name is None:
        raise ValueError(f"{action} needs an environment name")
    if not re.fullmatch(ENVIRONMENT_PATTERN, name):
        raise ValueError(f"{name!r} is not an environment name ({ENVIRONMENT_PATTERN})")
    if action == "open":
        return [describe(board.force_open(name, operator_identity()), cooldown)]
    if action == "close":
        return [describe(board.force_close(name, operator_identity()), cooldown)]
    raise ValueError(f"unknown action {action!r}")
