"""Restarting the local stack's children (engines, broker, object store, worker) when they die.

``tiergate up`` runs several long-lived processes; one that exits while the stack is up (an
engine killed by the OOM killer, ``kill -9``, a crash) is started again after a delay that
doubles from :attr:`Backoff.first_seconds` to :attr:`Backoff.ceiling_seconds` while it
keeps dying, and falls back to the first delay once a run has lasted
:attr:`Backoff.reset_after_seconds`. Each restart is said on stderr. Once :meth:`Supervisor.stop`
has been called (the stack is shutting down) nothing is restarted, so children stopped on
purpose stay stopped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

Start = Callable[[], "subprocess.Popen[bytes]"]


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long to wait before restarting a child that exited."""

    first_seconds: float = 1.0
    ceiling_seconds: float = 60.0
    # A run at least this long counts as healthy: the next exit waits first_seconds again.
    reset_after_seconds: float = 60.0

    def next_delay(self, previous: float | None, ran_seconds: float) -> float:
        if previous is None or ran_seconds >= self.reset_after_seconds:
            return self.first_seconds
        return min(previous * 2, self.ceiling_seconds)


def describe_exit(returncode: int) -> str:
    """``signal 9`` for a process killed by a signal, ``code 1`` for one that exited."""
    return f"signal {-returncode}" if returncode < 0 else f"code {returncode}"


def log_tail(log: Path | None, lines: int = 3, max_bytes: int = 4096) -> str:
    """The last ``lines`` non-empty lines of a child's log (its last ``max_bytes`` read), as
    one string to print after its exit; empty when there is no log."""
    if log is None:
        return ""
    try:
        with log.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - max_bytes))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    # Printed on the operator's terminal: a log line may carry text a job or a caller
    # chose (an engine's error quoting a request), so no control character goes through.
    return "".join(c if c.isprintable() else "?" for c in " | ".join(kept))


def kill_leftovers(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL what is left of an exited child's process group (its children started with
    ``start_new_session``), so that a replacement finds its ports free."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


@dataclass
class Child:
    """A supervised process: its current ``proc`` and how to start it again."""

    name: str
    proc: subprocess.Popen[bytes]
    start: Start
    started_at: float
    restarts: int = 0
    delay: float | None = None
    restart_at: float | None = None
    delays: list[float] = field(default_factory=list)
    # Where its output goes: the end of it is said with each exit (why it died).
    log: Path | None = None


class Supervisor:
    """Watches children from one thread and restarts those that exit, with backoff."""

    def __init__(
        self,
        say: Callable[[str], None],
        *,
        backoff: Backoff | None = None,
        poll_seconds: float = 0.2,
    ) -> None:
        self._say = say
        self._backoff = backoff or Backoff()
        self._poll = poll_seconds
        self._children: list[Child] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(
        self, name: str, proc: subprocess.Popen[bytes], start: Start, log: Path | None = None
    ) -> Child:
        """Supervise ``proc``; ``start`` starts a replacement (it may wait for readiness and
        may raise, which counts as one more exit); ``log``, where its output goes, is quoted
        with each exit. Starts the watching thread on first use."""
        child = Child(name, proc, start, time.monotonic(), log=log)
        with self._lock:
            self._children.append(child)
            if self._thread is None and not self._stopping.is_set():
                self._thread = threading.Thread(
                    target=self._run, name="tiergate-supervisor", daemon=True
                )
                self._thread.start()
        return child

    def unwatch(self, child: Child) -> None:
        """Stop watching ``child`` (one stopped on purpose while the stack runs on)."""
        with self._lock:
            if child in self._children:
                self._children.remove(child)

    def stop(self) -> None:
        """No more restarts; waits for a restart in progress, so that every child's ``proc``
        is the one to stop afterwards."""
        self._stopping.set()
        thread = self._thread
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while not self._stopping.wait(self._poll):
            with self._lock:
                for child in self._children:
                    if self._stopping.is_set():
                        return
                    self._check(child)

    def _check(self, child: Child) -> None:
        now = time.monotonic()
        if child.restart_at is None:
            returncode = child.proc.poll()
            if returncode is None:
                return
            child.delay = self._backoff.next_delay(child.delay, now - child.started_at)
            child.delays.append(child.delay)
            child.restart_at = now + child.delay
            tail = log_tail(child.log)
            said = f"; its log ({child.log}) ends: {tail}" if tail else ""
            self._say(
                f"{child.name} exited ({describe_exit(returncode)}); "
                f"restarting in {child.delay:g} s{said}"
            )
            return
        if now < child.restart_at:
            return
        child.restart_at = None
        child.started_at = time.monotonic()
        try:
            child.proc = child.start()
        except Exception as exc:  # any failure to start counts as one more exit
            self._say(f"{child.name} failed to restart: {exc}")
            child.delay = self._backoff.next_delay(child.delay, 0.0)
            child.delays.append(child.delay)
            child.restart_at = time.monotonic() + child.delay
            self._say(f"retrying {child.name} in {child.delay:g} s")
            return
        child.restarts += 1
        self._say(f"{child.name} restarted (pid {child.proc.pid})")
