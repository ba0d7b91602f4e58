"""The local stack's supervisor, driven with small stand-in children (``sleep`` and
``python -c``), never real engines: a killed child comes back, its delay doubles while it
keeps dying, and nothing is restarted once the stack is stopping."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.waiting import eventually
from tiergate.local.supervisor import Backoff, Supervisor, describe_exit, log_tail

FAST = Backoff(first_seconds=0.1, ceiling_seconds=0.4, reset_after_seconds=30.0)


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "60"], start_new_session=True)


def _crasher() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"], start_new_session=True)


@pytest.fixture
def said() -> list[str]:
    return []


@pytest.fixture
def supervisor(said: list[str]) -> Iterator[Supervisor]:
    sup = Supervisor(said.append, backoff=FAST, poll_seconds=0.02)
    yield sup
    sup.stop()


def test_a_killed_child_is_restarted_and_said(supervisor: Supervisor, said: list[str]) -> None:
    first = _sleeper()
    child = supervisor.watch("fast engine", first, _sleeper)
    os.kill(first.pid, signal.SIGKILL)
    eventually(lambda: child.restarts == 1, 10, what=lambda: f"a restart; said {said}")
    assert child.proc.pid != first.pid and child.proc.poll() is None
    assert said[0] == "fast engine exited (signal 9); restarting in 0.1 s"
    child.proc.kill()
    child.proc.wait()


def test_the_delay_doubles_up_to_the_ceiling(supervisor: Supervisor, said: list[str]) -> None:
    child = supervisor.watch("broker", _crasher(), _crasher)
    eventually(lambda: len(child.delays) >= 5, 20, what=lambda: f"five exits; said {said}")
    assert child.delays[:5] == [0.1, 0.2, 0.4, 0.4, 0.4]
    assert "broker exited (code 3); restarting in 0.2 s" in said


def test_a_long_run_resets_the_delay() -> None:
    backoff = Backoff(first_seconds=1, ceiling_seconds=60, reset_after_seconds=60)
    assert backoff.next_delay(None, 0) == 1
    assert backoff.next_delay(8, 5) == 16
    assert backoff.next_delay(32, 5) == 60
    assert backoff.next_delay(32, 61) == 1


def test_a_failed_restart_counts_as_an_exit(supervisor: Supervisor, said: list[str]) -> None:
    def refuses() -> subprocess.Popen[bytes]:
        raise RuntimeError("port 9092 is already taken")

    child = supervisor.watch("broker", _crasher(), refuses)
    eventually(lambda: len(child.delays) >= 3, 10, what=lambda: f"three tries; said {said}")
    assert child.delays[:3] == [0.1, 0.2, 0.4]
    assert "broker failed to restart: port 9092 is already taken" in said


def test_children_stopped_at_shutdown_stay_stopped(said: list[str]) -> None:
    supervisor = Supervisor(said.append, backoff=FAST, poll_seconds=0.02)
    started: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        started.append(_sleeper())
        return started[-1]

    child = supervisor.watch("job worker", start(), start)
    supervisor.stop()
    child.proc.terminate()
    child.proc.wait()
    # stop() returned after the watching thread did: nothing is left to restart it, and a
    # child watched from now on is not watched at all.
    late = supervisor.watch("late", _crasher(), start)
    late.proc.wait()
    assert len(started) == 1 and child.restarts == late.restarts == 0 and said == []


def test_exits_are_described() -> None:
    assert describe_exit(-9) == "signal 9"
    assert describe_exit(1) == "code 1"


def test_an_exit_is_said_with_the_end_of_the_childs_log(
    supervisor: Supervisor, said: list[str], tmp_path: Path
) -> None:
    """A worker that dies at start (its broker gone) said only 'exited (code 1)' again and
    again; the end of its log says why."""
    log = tmp_path / "worker.log"

    def failing() -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            return subprocess.Popen(
                [sys.executable, "-c", "print('starting'); print('NoBrokersAvailable'); exit(1)"],
                stdout=out,
                start_new_session=True,
            )

    supervisor.watch("job worker", failing(), failing, log)
    eventually(lambda: any("exited (code 1)" in line for line in said), timeout=10)
    line = next(line for line in said if "exited (code 1)" in line)
    assert f"its log ({log}) ends: starting | NoBrokersAvailable" in line


def test_a_logs_control_characters_do_not_reach_the_terminal(tmp_path: Path) -> None:
    """Attacker's test: a log line carrying terminal escapes (text a caller chose, quoted by
    an engine's error) is said with them replaced."""
    log = tmp_path / "engine.log"
    log.write_bytes(b"ok\n\x1b]0;owned\x07bad request \x1b[2J\r\n")
    assert log_tail(log) == "ok | ?]0;owned?bad request ?[2J"
