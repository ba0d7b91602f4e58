"""The soak's driver (tiergate.bench.soak.load) where the 60-minute run of 2026-12-07 found
it wanting: a typed error event in a job's event stream (the store killed mid-stream)
crashed the stream's thread, and its record was never written, so the check never saw
that stream. Over httpx.MockTransport (a fake gateway)."""

from __future__ import annotations

import threading
import time

import httpx

from tiergate.bench.soak.load import History, follow_events, paced


def _sse(*events: str) -> bytes:
    return "".join(f"data: {e}\n\n" for e in events).encode()


def test_an_error_event_mid_stream_is_recorded_and_the_stream_resumed() -> None:
    calls: list[str] = []

    def gateway(request: httpx.Request) -> httpx.Response:
        after = request.url.params["starting_after"]
        calls.append(after)
        if after == "0":
            body = _sse('{"sequence_number": 1, "type": "job.queued"}')
            body += _sse('{"error": {"type": "server_error", "code": "store_unavailable"}}')
        else:
            body = _sse('{"sequence_number": 2, "type": "job.completed"}', "[DONE]")
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    history = History()
    with httpx.Client(transport=httpx.MockTransport(gateway), base_url="http://gw") as client:
        follow_events(client, history, "team-a", "key", "job_x", time.time() + 10)
    (record,) = history.of("events")
    assert record["seen"] == [1, 2] and record["done"] is True
    assert record["error"] == "store_unavailable" and calls == ["0", "1"]


def test_a_driver_call_that_raises_is_given_to_failed() -> None:
    stop = threading.Event()
    failures: list[tuple[int, str]] = []

    def call(n: int) -> None:
        stop.set()
        raise KeyError("sequence_number")

    paced(1000.0, stop, call, lambda n, exc: failures.append((n, repr(exc))))
    deadline = time.time() + 5
    while not failures and time.time() < deadline:
        time.sleep(0.01)
    assert failures == [(0, "KeyError('sequence_number')")]
