"""Fault injection with FakeVllm: what a client sees when an upstream misbehaves."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.fault.helpers import load_seen, metric_value, sse_events
from tests.servers import gateway_settings, running_gateway
from tests.waiting import eventually

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


def test_stream_cut_mid_way_ends_with_one_error_event(fakes: list[FakeVllm]) -> None:
    fakes[0].behaviour.mode = "cut_stream"
    settings = gateway_settings([fakes[0].url], [fakes[2].url])
    with running_gateway(settings) as base:
        resp = httpx.post(f"{base}/v1/chat/completions", json={**CHAT, "stream": True})
        assert resp.status_code == 200
        events = sse_events(resp.text)
        assert "[DONE]" not in events
        last = json.loads(events[-1])
        assert last["error"]["code"] == "upstream_stream_broken"
        assert set(last["error"]) == {"message", "type", "param", "code"}
        # The chunks before the cut were forwarded, with the served tier echoed.
        assert [json.loads(e)["service_tier"] for e in events[:-1]] == ["default", "default"]
        assert metric_value(base, "tiergate_stream_errors_total", tier="standard") == 1


def test_stream_ending_without_done_is_reported(fakes: list[FakeVllm]) -> None:
    fakes[0].behaviour.mode = "truncate_stream"
    with running_gateway(gateway_settings([fakes[0].url], [fakes[2].url])) as base:
        events = sse_events(
            httpx.post(
                f"{base}/v1/completions", json={"model": MODEL, "prompt": "x", "stream": True}
            ).text
        )
        assert json.loads(events[-1])["error"]["code"] == "upstream_stream_broken"
        assert len(events) == 6  # five chunks, then the error


def test_stream_stalling_between_chunks_times_out(fakes: list[FakeVllm]) -> None:
    fakes[0].behaviour.mode = "stall_stream"
    settings = gateway_settings(
        [fakes[0].url], [fakes[2].url], timeouts={"between_chunks_seconds": 0.5}
    )
    with running_gateway(settings) as base:
        started = time.monotonic()
        events = sse_events(
            httpx.post(f"{base}/v1/chat/completions", json={**CHAT, "stream": True}).text
        )
        assert time.monotonic() - started < 5
        assert json.loads(events[-1])["error"]["code"] == "upstream_timeout"


@pytest.mark.parametrize("status", [500, 503, 429, 502])
def test_retryable_status_is_retried_on_another_endpoint(
    fakes: list[FakeVllm], status: int
) -> None:
    bad, good = fakes[0], fakes[1]
    bad.behaviour.mode = "status"
    bad.behaviour.status = status
    # Load makes the bad endpoint the first choice, so every request meets it first.
    good.behaviour.running = 50
    settings = gateway_settings(
        [bad.url, good.url], [fakes[2].url], health={"eject_after_failures": 100}
    )
    with running_gateway(settings) as base:
        eventually(lambda: load_seen(good), what="the good endpoint's load read")
        for _ in range(3):
            resp = httpx.post(f"{base}/v1/chat/completions", json=CHAT)
            assert resp.status_code == 200, resp.text
            assert resp.json()["service_tier"] == "default"
        assert bad.record.requests >= 1
        assert good.record.requests == 3
        assert metric_value(base, "tiergate_retries_total", tier="standard") >= 1


def test_non_retryable_upstream_error_is_normalised_not_retried(fakes: list[FakeVllm]) -> None:
    fakes[0].behaviour.mode = "status"
    fakes[0].behaviour.status = 400
    fakes[1].behaviour.running = 50
    with running_gateway(gateway_settings([fakes[0].url, fakes[1].url], [fakes[2].url])) as base:
        eventually(lambda: load_seen(fakes[1]), what="the second endpoint's load read")
        resp = httpx.post(f"{base}/v1/chat/completions", json=CHAT)
        assert resp.status_code == 400
        err = resp.json()["error"]
        assert err == {
            "message": "fake failure 400",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
        assert fakes[1].record.requests == 0


def test_hung_upstream_times_out_and_is_ejected(fakes: list[FakeVllm]) -> None:
    hung, good = fakes[0], fakes[1]
    hung.behaviour.mode = "hang"
    good.behaviour.running = 50  # prefer the hung endpoint while both are healthy
    settings = gateway_settings(
        [hung.url, good.url], [fakes[2].url], timeouts={"first_byte_seconds": 0.5}
    )
    with running_gateway(settings) as base:
        eventually(lambda: load_seen(good), what="the good endpoint's load read")
        first = httpx.post(f"{base}/v1/chat/completions", json=CHAT)
        assert first.status_code == 200 and good.record.requests == 1
        assert metric_value(base, "tiergate_endpoint_healthy", endpoint=hung.url) == 0
        assert metric_value(base, "tiergate_endpoint_ejections_total", tier="standard") == 1
        started = time.monotonic()
        for _ in range(3):
            assert httpx.post(f"{base}/v1/chat/completions", json=CHAT).status_code == 200
        assert time.monotonic() - started < 1.5  # the ejected endpoint is no longer tried
        assert hung.record.requests == 1


def test_single_hung_endpoint_gives_504_envelope(fakes: list[FakeVllm]) -> None:
    fakes[0].behaviour.mode = "hang"
    settings = gateway_settings(
        [fakes[0].url],
        [fakes[2].url],
        timeouts={"first_byte_seconds": 0.5},
        policy={"fallback": False},
    )
    with running_gateway(settings) as base:
        resp = httpx.post(f"{base}/v1/chat/completions", json=CHAT)
        assert resp.status_code == 504
        assert resp.json()["error"]["code"] == "upstream_timeout"
        assert resp.json()["error"]["type"] == "server_error"


def test_client_disconnect_cancels_streaming_upstream(fakes: list[FakeVllm]) -> None:
    fakes[0].behaviour.chunks = 100
    fakes[0].behaviour.chunk_delay = 0.1
    with running_gateway(gateway_settings([fakes[0].url], [fakes[2].url])) as base:
        with httpx.stream(
            "POST", f"{base}/v1/chat/completions", json={**CHAT, "stream": True}
        ) as resp:
            lines = resp.iter_lines()
            assert next(lines).startswith("data: ")
        assert fakes[0].wait_for(lambda: fakes[0].record.cancelled == 1, timeout=3)
        assert fakes[0].wait_for(
            lambda: metric_value(base, "tiergate_endpoint_in_flight", tier="standard") == 0
        )


def test_client_disconnect_cancels_non_streaming_upstream(fakes: list[FakeVllm]) -> None:
    fakes[0].behaviour.mode = "hang"
    with running_gateway(gateway_settings([fakes[0].url], [fakes[2].url])) as base:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{base}/v1/chat/completions", json=CHAT, timeout=0.5)
        assert fakes[0].wait_for(lambda: fakes[0].record.cancelled == 1, timeout=3)
        assert metric_value(base, "tiergate_client_disconnects_total") == 1
