"""Timed rounds that no user shared (issue 53 item 2).

``tiergate up`` serves while it tunes, on the same cores: a user's request during a timed
round slows both engines under test unevenly and skews the speedup, and the tuner's round
slows the user. So each timed round of a tuning next to serving engines is run in a quiet
window of those engines, read from vLLM's own counters (``/metrics``):

- before a round, it waits until the watched engines have nothing running or waiting (up
  to ``wait_seconds``; then it goes on, and the round is judged as any other);
- after it, the requests the watched engines saw (``vllm:request_success_total`` plus those
  running and waiting) are compared with the round's own requests sent there: more means a
  user's request shared the round, whose samples are dropped and the round run again, at
  most ``retries`` times (the last one is kept, and counted as shared).

The bound this gives users: a request arriving mid-round shares the cores with at most the
rest of that round (a few requests of at most ``tuning.max_tokens`` tokens each), and no
round starts while one is in flight. The parity judgement, which is not timed, is not held
back. Watching costs one ``/metrics`` read per engine per round and per half second of
waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import httpx

_T = TypeVar("_T")
_SEEN = ("vllm:request_success_total",)
_IN_FLIGHT = ("vllm:num_requests_running", "vllm:num_requests_waiting")

Progress = Callable[[str], None]


def _quiet_progress(message: str) -> None:
    pass


def _sum_metric(text: str, names: tuple[str, ...]) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            try:
                total += float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
    return total


@dataclass(frozen=True)
class EngineActivity:
    """What one engine had seen (finished, plus running and waiting) and had in flight."""

    seen: float
    in_flight: float


def read_activity(url: str, timeout: float = 5.0) -> EngineActivity:
    text = httpx.get(f"{url}/metrics", timeout=timeout).text
    in_flight = _sum_metric(text, _IN_FLIGHT)
    return EngineActivity(_sum_metric(text, _SEEN) + in_flight, in_flight)


@dataclass
class QuietWatch:
    """Runs timed rounds in quiet windows of the engines at ``urls`` (see the module)."""

    urls: list[str]
    progress: Progress = _quiet_progress
    wait_seconds: float = 120.0
    retries: int = 3
    poll_seconds: float = 0.5
    read: Callable[[str], EngineActivity] = read_activity
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    # Rounds run again because a user's request shared them, and rounds kept shared.
    repeated: int = 0
    kept_shared: int = 0
    waited_seconds: float = field(default=0.0)

    def _activity(self) -> dict[str, EngineActivity]:
        """Each engine's counters; one that cannot be read (a busy or restarting engine)
        reads as busy and unknown (``seen`` -1), which no round counts as quiet."""
        found = {}
        for url in self.urls:
            try:
                found[url] = self.read(url)
            except (httpx.HTTPError, OSError, ValueError):
                found[url] = EngineActivity(-1.0, 1.0)
        return found

    def _wait_quiet(self) -> dict[str, EngineActivity]:
        started = self.clock()
        while True:
            now = self._activity()
            if all(a.in_flight == 0 for a in now.values()):
                break
            if self.clock() - started >= self.wait_seconds:
                break
            self.sleep(self.poll_seconds)
        self.waited_seconds += self.clock() - started
        return now

    def run(self, round_: Callable[[], _T], own: Mapping[str, int]) -> _T:
        """``round_`` in a quiet window; ``own``: the requests it sends to each watched
        URL (its own, which the counters also see)."""
        for attempt in range(self.retries + 1):
            before = self._wait_quiet()
            result = round_()
            after = self._activity()
            others = sum(after[url].seen - before[url].seen - own.get(url, 0) for url in self.urls)
            # A request already in flight when the round began (the wait ran out), or
            # counters that could not be read, share the round however the counts net out.
            unsure = any(a.in_flight > 0 or a.seen < 0 for a in before.values()) or any(
                a.seen < 0 for a in after.values()
            )
            others = max(others, 1.0) if unsure else others
            if others <= 0:
                return result
            if attempt == self.retries:
                self.kept_shared += 1
                self.progress(
                    f"  a timed round shared the engines with {others:.0f} user request(s) "
                    f"{self.retries + 1} times; kept"
                )
                return result
            self.repeated += 1
            self.progress(
                f"  a timed round shared the engines with {others:.0f} user request(s); "
                "measured again"
            )
        raise AssertionError("unreachable")
