"""The tuner's timed rounds beside serving engines (tiergate.measure.quiet): a round that a
user's request shared is run again, no round starts while one is in flight, and the
figures it keeps come from rounds no user shared. A scripted ``read`` (a fake of vLLM's
counters) for the decisions; fake vLLM servers on loopback for the measured rounds."""

from __future__ import annotations

import threading

import httpx

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tiergate.measure.quiet import EngineActivity, QuietWatch, read_activity
from tiergate.tuning.speed import measure_speed

URL = "http://serving"


class Counters:
    """A fake engine's counters: what it has seen, and what is in flight."""

    def __init__(self) -> None:
        self.seen = 0.0
        self.in_flight = 0.0
        self.reads = 0
        self.busy_reads = 0  # reads that still find a request in flight

    def read(self, url: str) -> EngineActivity:
        assert url == URL
        self.reads += 1
        if self.busy_reads:
            self.busy_reads -= 1
            return EngineActivity(self.seen, 1.0)
        return EngineActivity(self.seen, self.in_flight)


def _watch(counters: Counters, **kwargs: object) -> tuple[QuietWatch, list[float]]:
    slept: list[float] = []
    clock = [0.0]

    def sleep(s: float) -> None:
        slept.append(s)
        clock[0] += s

    watch = QuietWatch(
        [URL],
        read=counters.read,
        sleep=sleep,
        clock=lambda: clock[0],
        **kwargs,  # type: ignore[arg-type]
    )
    return watch, slept


def test_a_round_a_user_shared_is_measured_again_and_the_clean_one_kept() -> None:
    counters = Counters()
    watch, _ = _watch(counters)
    runs: list[int] = []

    def round_() -> int:
        runs.append(len(runs))
        counters.seen += 3  # the round's own three requests
        if len(runs) == 1:
            counters.seen += 1  # and a user's, during the first run only
        return len(runs)

    assert watch.run(round_, {URL: 3}) == 2
    assert runs == [0, 1] and watch.repeated == 1 and watch.kept_shared == 0


def test_no_round_starts_while_a_users_request_is_in_flight() -> None:
    counters = Counters()
    counters.busy_reads = 4
    watch, slept = _watch(counters, poll_seconds=0.5)
    started_after: list[int] = []

    def round_() -> None:
        started_after.append(counters.reads)
        counters.seen += 2

    watch.run(round_, {URL: 2})
    assert len(slept) == 4 and watch.waited_seconds == 2.0
    assert started_after == [5]  # four busy reads, then the quiet one


def test_the_wait_is_bounded_and_a_round_always_shared_is_kept_once_counted() -> None:
    counters = Counters()
    counters.in_flight = 1.0  # a user's stream that never ends
    watch, _ = _watch(counters, wait_seconds=5.0, retries=2)

    def round_() -> str:
        counters.seen += 2  # its own two, and the user's stream seen as one more
        counters.seen += 1
        return "kept"

    assert watch.run(round_, {URL: 2}) == "kept"
    assert watch.repeated == 2 and watch.kept_shared == 1
    assert watch.waited_seconds >= 3 * 5.0


def test_measured_rounds_against_fake_engines_drop_the_one_a_user_shared() -> None:
    serving, candidate = FakeVllm().start(), FakeVllm().start()
    try:
        serving.behaviour.chunk_delay = candidate.behaviour.chunk_delay = 0.02
        before = read_activity(serving.url)
        assert before.seen == 0 and before.in_flight == 0
        watch = QuietWatch([serving.url], poll_seconds=0.05)
        user_sent = threading.Event()

        def user() -> None:
            # One user request to the serving engine while the tuner's first round runs.
            serving.wait_for(lambda: len(serving.record.bodies) >= 1, 10)
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
            httpx.post(f"{serving.url}/v1/chat/completions", json=body, timeout=10)
            user_sent.set()

        thread = threading.Thread(target=user, daemon=True)
        thread.start()
        figures = measure_speed(
            serving.url, candidate.url, MODEL, [1], 4, 8, rounds=2, progress=print, quiet=watch
        )
        thread.join(10)
        assert user_sent.is_set()
        assert watch.repeated >= 1, "the shared round was kept"
        # Two rounds of two a side, the shared round once more, and the user's request.
        assert len(serving.record.bodies) == 4 + 2 * watch.repeated + 1
        assert len(candidate.record.bodies) == 4
        assert set(figures.speedup) == {"1"}
    finally:
        serving.stop()
        candidate.stop()


def test_a_round_begun_with_a_request_in_flight_or_unread_counters_is_shared() -> None:
    """Review findings: a round begun after the wait ran out with a user's request still
    in flight netted that request out (it moved from running to finished inside the round)
    and counted as quiet; and counters that could not be read ended the candidate."""
    counters = Counters()
    counters.in_flight = 1.0
    watch, _ = _watch(counters, wait_seconds=1.0, retries=1)

    def round_() -> None:
        counters.seen += 2  # its own two; the user's request finishes meanwhile
        counters.in_flight = 0.0

    watch.run(round_, {URL: 2})
    assert watch.repeated == 1  # the first round was shared; the second began quiet

    def unreadable(url: str) -> EngineActivity:
        raise httpx.ConnectError("restarting")

    blind = QuietWatch([URL], read=unreadable, wait_seconds=0.0, retries=1, sleep=lambda s: None)
    assert blind.run(lambda: "kept", {URL: 1}) == "kept"
    assert blind.repeated == 1 and blind.kept_shared == 1
