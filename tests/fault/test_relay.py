"""Relaying answers with FakeVllm: large bodies arrive whole, byte for byte, within the
first-byte timeout; a slow or leaving client is never the engine's failure, and its slot
and tokens are accounted. (How fast the relay is, is tiergate bench gateway's.)"""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import orjson

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.fault.helpers import metric_value
from tests.servers import gateway_settings, running_gateway
from tests.waiting import eventually
from tiergate.gateway.access.auth import new_key

# vLLM answers /tokenize of a prompt this long with about 1.8 MB (the fake's tokens: code
# points, "120," per character).
LONG_PROMPT = {"model": MODEL, "prompt": "x" * 450_000}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


def _timed_post(url: str, body: dict[str, Any]) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    resp = httpx.post(url, json=body, timeout=30)
    return resp, time.monotonic() - started


def test_a_large_answer_arrives_whole_within_the_first_byte_timeout(
    fakes: list[FakeVllm],
) -> None:
    """1.8 MB relayed as the engine sent it, inside a 2 s first-byte timeout (a relay that
    held it back would time out). How fast, against the engine alone, is a benchmark's
    question (one sample on a shared 2-core machine proves nothing)."""
    settings = gateway_settings(
        [fakes[0].url], [fakes[2].url], timeouts={"first_byte_seconds": 2.0}
    )
    with running_gateway(settings) as base:
        direct, _ = _timed_post(f"{fakes[0].url}/tokenize", LONG_PROMPT)
        relayed, _ = _timed_post(f"{base}/tokenize", LONG_PROMPT)
        assert len(direct.content) > 1_700_000
        assert relayed.status_code == 200, relayed.text[:300]
        assert relayed.content == direct.content
        # A large answer the gateway rewrites (service_tier) is read whole, not stalled.
        fakes[0].behaviour.replies = ["y" * 1_500_000]
        chat, _ = _timed_post(f"{base}/v1/chat/completions", CHAT)
        assert chat.status_code == 200
        assert len(chat.json()["choices"][0]["message"]["content"]) == 1_500_000
        assert chat.json()["service_tier"] == "default"


def test_ten_large_answers_at_once_eject_no_endpoint(fakes: list[FakeVllm]) -> None:
    settings = gateway_settings(
        [fakes[0].url], [fakes[2].url], timeouts={"first_byte_seconds": 2.0}
    )
    with running_gateway(settings) as base:
        with ThreadPoolExecutor(10) as pool:
            answers = list(
                pool.map(lambda _: _timed_post(f"{base}/tokenize", LONG_PROMPT), range(10))
            )
        statuses = [resp.status_code for resp, _ in answers]
        assert statuses == [200] * 10
        assert metric_value(base, "tiergate_endpoint_ejections_total") == 0
        assert metric_value(base, "tiergate_endpoint_healthy", endpoint=fakes[0].url) == 1


def test_stream_left_before_its_usage_is_charged_what_was_relayed(
    fakes: list[FakeVllm],
) -> None:
    key, digest = new_key()
    auth = {
        "enabled": True,
        "keys": [{"name": "app", "hash": digest, "limits": {"tokens_per_minute": 1000}}],
    }
    # Five chunks of 3,200 characters: about 4,000 tokens relayed, four minutes' worth.
    fakes[0].behaviour.chunk_chars = 3200
    fakes[0].behaviour.usage_delay = 30.0
    settings = gateway_settings([fakes[0].url], [fakes[2].url], auth=auth)
    headers = {"authorization": f"Bearer {key}"}
    with running_gateway(settings) as base:
        url = f"{base}/v1/chat/completions"
        with httpx.stream("POST", url, json={**CHAT, "stream": True}, headers=headers) as resp:
            assert resp.status_code == 200
            contents = 0
            for line in resp.iter_lines():
                if line.startswith("data: ") and '"content"' in line:
                    contents += 1
                if contents == 5:
                    break  # the last content chunk: leave before the usage chunk
        eventually(
            lambda: httpx.post(url, json=CHAT, headers=headers).status_code == 429,
            10,
            what="the relayed tokens charged to the key",
        )
        refused = httpx.post(url, json=CHAT, headers=headers)
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert "tokens per minute" in refused.json()["error"]["message"]


def test_stream_closed_by_the_client_at_its_done_is_served_not_cancelled(
    fakes: list[FakeVllm],
) -> None:
    """The openai SDK closes the connection as soon as it reads ``[DONE]``; vLLM ends its
    body in a later write. The client got the whole answer: a 200, not a disconnect."""
    fakes[0].behaviour.end_delay = 2.0
    with running_gateway(gateway_settings([fakes[0].url], [fakes[2].url])) as base:
        url = f"{base}/v1/chat/completions"
        with httpx.stream("POST", url, json={**CHAT, "stream": True}) as resp:
            assert resp.status_code == 200
            lines = []
            for line in resp.iter_lines():
                lines.append(line)
                if line == "data: [DONE]":
                    break  # and close, as the SDK does
        assert lines[-1] == "data: [DONE]"

        def counted(status: str) -> float:
            return metric_value(base, "tiergate_requests_total", tier="standard", status=status)

        eventually(lambda: counted("200") + counted("499") == 1, 10, what="the stream counted")
        assert counted("200") == 1
        assert metric_value(base, "tiergate_client_disconnects_total") == 0


def _in_flight(base: str) -> float:
    return metric_value(base, "tiergate_admission_in_flight", tier="standard", lane="all")


def test_client_that_stops_reading_is_cut_and_its_slot_comes_back(
    fakes: list[FakeVllm],
) -> None:
    # About 40 MB of stream, as fast as the fake can write: far past every socket buffer.
    fakes[0].behaviour.chunks = 40_000
    fakes[0].behaviour.chunk_chars = 1000
    settings = gateway_settings(
        [fakes[0].url], [fakes[2].url], timeouts={"client_write_seconds": 0.5}
    )
    with running_gateway(settings) as base:
        port = int(base.rsplit(":", 1)[1])
        body = orjson.dumps({**CHAT, "stream": True})
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            sock.connect(("127.0.0.1", port))
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\n"
                b"content-type: application/json\r\n"
                + b"content-length: %d\r\n\r\n" % len(body)
                + body
            )
            # Nothing is read from here on.
            eventually(lambda: fakes[0].record.requests == 1, what="the stream at the engine")
            eventually(
                lambda: (
                    metric_value(
                        base,
                        "tiergate_stream_errors_total",
                        tier="standard",
                        reason="client_stalled",
                    )
                    == 1
                ),
                20,
                what="the stalled client cut",
            )
            eventually(lambda: _in_flight(base) == 0, 10, what="the admission slot returned")
            eventually(lambda: fakes[0].record.cancelled == 1, 10, what="the engine's request")
            assert metric_value(base, "tiergate_endpoint_ejections_total") == 0
            assert httpx.post(f"{base}/v1/chat/completions", json=CHAT).status_code == 200
        finally:
            sock.close()
