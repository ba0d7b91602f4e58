"""The workers' key from a file (jobs.worker.api_key_file, the chart's mounted Secret): a
rotated key is used without a restart, and a call answered 401 is tried once more with
what the file holds now."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tiergate.jobs.run.agent import ModelClient, ModelRefused, ModelUnavailable, WorkerKey
from tiergate.settings import load_settings

ANSWER = {"choices": [{"message": {"role": "assistant", "content": "DONE"}}]}


class Gateway:
    """Answers chat completions for one key (``accepted``), 401 for any other."""

    def __init__(self) -> None:
        self.accepted = "tg-old"
        self.seen: list[str | None] = []
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["content-length"]))
                auth = self.headers.get("authorization")
                gateway.seen.append(auth)
                ok = auth == f"Bearer {gateway.accepted}"
                body = json.dumps(ANSWER if ok else {"error": {"message": "bad key"}}).encode()
                self.send_response(200 if ok else 401)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def gateway() -> Iterator[Gateway]:
    served = Gateway()
    yield served
    served.close()


def _rotate(path: Path, key: str) -> None:
    """As the kubelet updates a mounted Secret: a new file put in place of the old."""
    fresh = path.with_name(path.name + ".new")
    fresh.write_text(key)
    os.replace(fresh, path)


def _client(gateway: Gateway, key: WorkerKey | str) -> ModelClient:
    return ModelClient(gateway.url, "m", "default", key, on_behalf_of="team-a")


def test_a_rotated_key_file_is_used_without_a_restart(gateway: Gateway, tmp_path: Path) -> None:
    path = tmp_path / "worker-api-key"
    path.write_text("tg-old\n")
    key = WorkerKey(path=str(path))
    client = _client(gateway, key)
    assert client.chat([{"role": "user", "content": "hi"}], None) == ANSWER
    # The key is rotated: the gateway takes only the new one, the file holds it.
    gateway.accepted = "tg-new"
    _rotate(path, "tg-new")
    assert client.chat([{"role": "user", "content": "hi"}], None) == ANSWER
    assert gateway.seen == ["Bearer tg-old", "Bearer tg-new"]  # no 401 on the way
    client.close()


def test_a_401_reads_the_file_again_and_retries_once(gateway: Gateway, tmp_path: Path) -> None:
    path = tmp_path / "worker-api-key"
    path.write_text("tg-old")
    key = WorkerKey(path=str(path))
    assert key.get() == "tg-old"
    # Rewritten in place with the same size and time: it looks unchanged until read.
    before = path.stat()
    path.write_text("tg-new")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert key.get() == "tg-old"
    gateway.accepted = "tg-new"
    client = _client(gateway, key)
    assert client.chat([{"role": "user", "content": "hi"}], None) == ANSWER
    assert gateway.seen == ["Bearer tg-old", "Bearer tg-new"]
    # A key the gateway refuses and the file still holds is refused once, not retried.
    gateway.seen.clear()
    gateway.accepted = "tg-other"
    with pytest.raises(ModelRefused, match="401"):
        client.chat([{"role": "user", "content": "hi"}], None)
    assert gateway.seen == ["Bearer tg-new"]
    client.close()


def test_a_fixed_key_is_not_retried(gateway: Gateway) -> None:
    client = _client(gateway, WorkerKey("tg-wrong"))
    with pytest.raises(ModelRefused, match="401"):
        client.chat([{"role": "user", "content": "hi"}], None)
    assert gateway.seen == ["Bearer tg-wrong"]
    # A plain string is a fixed key, as before.
    gateway.seen.clear()
    assert _client(gateway, "tg-old").chat([], None) == ANSWER
    assert gateway.seen == ["Bearer tg-old"]


def test_an_unreadable_file_keeps_the_last_key(tmp_path: Path) -> None:
    path = tmp_path / "worker-api-key"
    key = WorkerKey(path=str(path))
    with pytest.raises(ModelUnavailable, match="cannot be read"):
        key.get()
    path.write_text("tg-old")
    assert key.get() == "tg-old"
    _rotate(path, "  \n")  # caught empty: the last key stays
    assert key.get() == "tg-old"
    path.unlink()
    assert key.get(force=True) == "tg-old"


def test_the_setting_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERGATE_JOBS__WORKER__API_KEY_FILE", "/etc/tiergate-worker/key")
    assert load_settings().jobs.worker.api_key_file == "/etc/tiergate-worker/key"
