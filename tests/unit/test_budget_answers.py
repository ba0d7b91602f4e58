"""A spent budget ends the work that hit it, at once: a batch line refused 429
``insufficient_quota`` is answered with it (not retried for minutes in its chunk), and an
agent job's model call so refused ends the job's run (not retried while the day lasts).
A minimal HTTP server stands in for the gateway (a fake)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tiergate.jobs.lines.runner import _own_limit
from tiergate.jobs.run.agent import ModelClient, ModelRefused, ModelUnavailable
from tiergate.protocol.openaibatch import LIMIT_HEADER

QUOTA = {"error": {"message": "You exceeded your current quota", "code": "insufficient_quota"}}


def _answer(status: int, limit: str | None) -> httpx.Response:
    headers = {LIMIT_HEADER: limit} if limit else {}
    return httpx.Response(status, json=QUOTA, headers=headers)


def test_a_batch_line_refused_for_its_budget_is_answered_at_once() -> None:
    assert _own_limit(_answer(429, "budget"))
    assert _own_limit(_answer(429, "tokens"))
    assert not _own_limit(_answer(429, "concurrency"))  # waited out, as capacity
    assert not _own_limit(_answer(429, None))  # the gateway's capacity: retried


@pytest.fixture
def refusing() -> Iterator[dict[str, str | None]]:
    said: dict[str, str | None] = {"limit": "budget"}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            body = json.dumps(QUOTA).encode()
            self.send_response(429)
            if said["limit"]:
                self.send_header(LIMIT_HEADER, said["limit"])
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    said["url"] = f"http://127.0.0.1:{server.server_address[1]}"
    yield said
    server.shutdown()


def test_an_agent_jobs_call_refused_for_its_budget_ends_the_run(
    refusing: dict[str, str | None],
) -> None:
    url = refusing["url"]
    assert url is not None
    client = ModelClient(url, "m", "default", "tg-worker", on_behalf_of="team-a")
    with pytest.raises(ModelRefused, match="insufficient_quota"):
        client.chat([{"role": "user", "content": "hi"}], None)
    refusing["limit"] = None  # a 429 of capacity is still retried by the run
    with pytest.raises(ModelUnavailable):
        client.chat([{"role": "user", "content": "hi"}], None)
    client.close()
