"""The patient lane through a real gateway over FakeVllm: flex streams flood an engine
whose step grows with its batch (FakeBehaviour.load_delay), and interactive streams go one
after another. What an operator checks: the lane's limit on /metrics falls while the
interactive callers are slowed, the engine then holds no more patient requests than the
limit lets through, and once interactive callers are quiet the patient work gets every
slot again. A fake engine's timing, so the assertions are about the machinery, with wide
margins; what it is worth on a real engine is `tiergate bench batch`'s to say."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.fault.helpers import metric_value
from tests.servers import gateway_settings, running_gateway
from tests.waiting import eventually
from tiergate.settings import Settings

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
PATIENT = 12


def _lane_settings(fakes: list[FakeVllm], patient: int, **lane: float) -> Settings:
    """A gateway whose standard tier is ``fakes[0]``, with ``patient`` flex and patient
    slots and the lane's other settings as given."""
    return gateway_settings(
        [fakes[0].url],
        [fakes[2].url],
        admission={
            "flex": {"max_concurrent": patient},
            "patient": {"max_concurrent": patient, **lane},
        },
    )


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


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "not-streamed"])
def test_interactive_answers_slowed_by_patient_ones_shrink_the_lane_and_quiet_lifts_it(
    fakes: list[FakeVllm], stream: bool
) -> None:
    """Interactive callers who do not stream steer the lane as those who do: the gateway
    reads their answers from the engine's stream (assembled) and times them on it."""
    engine = fakes[0]
    engine.behaviour.chunks = 8
    engine.behaviour.chunk_delay = 0.01
    engine.behaviour.load_delay = 0.01
    settings = _lane_settings(fakes, PATIENT, adjust_seconds=0.3, quiet_seconds=2.0)
    with running_gateway(settings) as base:
        url = f"{base}/v1/chat/completions"

        def limit() -> float:
            return metric_value(base, "tiergate_patient_lane_limit", tier="standard")

        with _loops(url, {**CHAT, "service_tier": "flex"}, PATIENT) as patient:
            eventually(lambda: engine.record.in_flight >= PATIENT - 2, timeout=10)
            assert limit() == PATIENT  # nobody interactive: the patient work has it all
            with _loops(url, {**CHAT, "stream": stream}, 1) as interactive:
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


def _read_slowly(base: str, body: dict[str, object]) -> bytes:
    """One streamed request from a client that reads its answer slowly (64 KiB every 10 ms
    through a small receive window), as a caller on a poor link, or one who wants to look
    slow, does; returns the answer's bytes."""
    host, port = base.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(payload)}\r\n"
        "connection: close\r\n\r\n"
    ).encode()
    got = bytearray()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
        sock.connect((host, int(port)))
        sock.sendall(head + payload)
        while chunk := sock.recv(65536):
            got += chunk
            time.sleep(0.01)
    return bytes(got)


def test_a_client_that_reads_slowly_does_not_shrink_the_lane(fakes: list[FakeVllm]) -> None:
    """Attacker's test: the gateway timed a stream's TPOT to its last write to the client,
    so one caller reading a long answer slowly looked like an engine slowed by patient work,
    and cut the patient lane for every tenant's flex and batch work. What a slow reader
    waits for is its own doing: the lane does not take its stream."""
    engine = fakes[0]
    engine.behaviour.chunks = 100
    # 10 MB a stream: more than the kernel's socket buffers hold, so a slow reader's
    # writes wait (a smaller answer is written at once, whoever reads it).
    engine.behaviour.chunk_chars = 100_000
    # Quiet lifts the limit only long after the test: what it sees is the lane's.
    settings = _lane_settings(fakes, 4, adjust_seconds=0.2, quiet_seconds=60.0)
    with running_gateway(settings) as base:
        url = f"{base}/v1/chat/completions"

        def limit() -> float:
            return metric_value(base, "tiergate_patient_lane_limit", tier="standard")

        # The reference: interactive streams read at once, with no patient work in flight.
        with httpx.Client(timeout=60) as client:
            for _ in range(3):
                assert client.post(url, json=CHAT).status_code == 200
        flex = {**CHAT, "service_tier": "flex", "stream": False}  # short answers
        with _loops(url, flex, 4):
            eventually(lambda: engine.record.requests >= 8, timeout=10)
            seen: list[float] = []
            for _ in range(2):
                answer = _read_slowly(base, CHAT)
                assert b"data: [DONE]" in answer[-64:]
                seen.append(limit())
        assert seen == [4, 4]
