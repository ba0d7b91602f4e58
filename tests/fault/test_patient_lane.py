"""The patient lane through a real gateway over FakeVllm: flex streams flood an engine
whose step grows with its batch (FakeBehaviour.load_delay), and interactive streams go one
after another. What an operator checks: the lane's limit on /metrics falls while the
interactive callers are slowed, the engine then holds no more patient requests than the
limit lets through, and once interactive callers are quiet the patient work gets every
slot again. A fake engine's timing, so the assertions are about the machinery, with wide
margins; what it is worth on a real engine is `tiergate bench batch`'s to say."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.fault.helpers import metric_value
from tests.servers import gateway_settings, running_gateway
from tests.waiting import eventually

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
PATIENT = 12


@contextmanager
def _loops(url: str, body: dict[str, object], count: int) -> Iterator[list[int]]:
    """``count`` clients sending ``body`` one after another until the block ends; yields
    the statuses they got."""
    stop = threading.Event()
    statuses: list[int] = []

    def loop() -> None:
        with httpx.Client(timeout=60) as client:
            while not stop.is_set():
                statuses.append(client.post(url, json=body).status_code)

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(count)]
    for t in threads:
        t.start()
    try:
        yield statuses
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)


def test_interactive_streams_slowed_by_patient_ones_shrink_the_lane_and_quiet_lifts_it(
    fakes: list[FakeVllm],
) -> None:
    engine = fakes[0]
    engine.behaviour.chunks = 8
    engine.behaviour.chunk_delay = 0.01
    engine.behaviour.load_delay = 0.01
    settings = gateway_settings(
        [engine.url],
        [fakes[2].url],
        admission={
            "flex": {"max_concurrent": PATIENT},
            "patient": {
                "max_concurrent": PATIENT,
                "adjust_seconds": 0.3,
                "quiet_seconds": 2.0,
            },
        },
    )
    with running_gateway(settings) as base:
        url = f"{base}/v1/chat/completions"

        def limit() -> float:
            return metric_value(base, "tiergate_patient_lane_limit", tier="standard")

        with _loops(url, {**CHAT, "service_tier": "flex"}, PATIENT) as patient:
            eventually(lambda: engine.record.in_flight >= PATIENT - 2, timeout=10)
            assert limit() == PATIENT  # nobody interactive: the patient work has it all
            with _loops(url, CHAT, 1) as interactive:
                eventually(lambda: limit() <= 3, timeout=30)
                # The engine drains to what the lane lets through (and the one interactive).
                eventually(lambda: engine.record.in_flight <= limit() + 1, timeout=20)
                # A reference is measured beside the floor, and the slowdown from it.
                eventually(
                    lambda: (
                        metric_value(base, "tiergate_patient_lane_slowdown", tier="standard") > 0
                    ),
                    timeout=20,
                )
                assert limit() <= 6
            assert interactive and set(interactive) == {200}
            eventually(lambda: limit() == PATIENT, timeout=15)
            eventually(lambda: engine.record.in_flight >= PATIENT - 2, timeout=15)
        # Patient requests waited for slots; none was refused.
        assert patient and set(patient) == {200}
