"""Keys rotated in the keys file (the chart's mounted Secret) without a restart: through a
real gateway over FakeVllm, a revoked key stops working and a new one starts working within
``auth.keys_reload_seconds``; a half-written file leaves the keys as they were."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import httpx
import pytest

from tests.fakes.fake_vllm import FakeVllm
from tests.servers import gateway_settings, running_gateway
from tests.waiting import eventually
from tiergate.accesssettings import AuthSettings
from tiergate.gateway.access.auth import Authenticator, KeysFileError, new_key
from tiergate.gateway.errors import OpenAIError

RELOAD_SECONDS = 0.5


def _write(path: Path, **keys: str) -> None:
    """Replace the file the way the kubelet updates a Secret volume: a new file moved in."""
    fresh = path.with_suffix(".new")
    fresh.write_text(json.dumps([{"name": name, "hash": digest} for name, digest in keys.items()]))
    fresh.replace(path)


def test_a_revoked_key_stops_working_without_a_restart(
    fakes: list[FakeVllm], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="tiergate.auth")
    old, old_hash = new_key()
    new, new_hash = new_key()
    keys_file = tmp_path / "auth-keys"
    _write(keys_file, team=old_hash)
    auth = {"enabled": True, "keys_file": str(keys_file), "keys_reload_seconds": RELOAD_SECONDS}
    settings = gateway_settings([fakes[0].url], [fakes[2].url], auth=auth)
    with running_gateway(settings) as base:

        def status(key: str) -> int:
            headers = {"authorization": f"Bearer {key}"}
            return httpx.get(f"{base}/v1/models", headers=headers).status_code

        assert status(old) == 200 and status(new) == 401
        revoked_at = time.monotonic()
        _write(keys_file, team=new_hash)
        eventually(lambda: status(old) == 401, 10, what="the revoked key refused")
        # Bounded: the reload interval, plus a request's time.
        assert time.monotonic() - revoked_at < RELOAD_SECONDS + 2
        assert status(new) == 200
        # A file caught half-written keeps the keys that were: once the gateway has read
        # it (it says so in its log; requests make it look), the keys are still the new one.
        caplog.clear()
        keys_file.write_text('[{"name": "team", "ha')

        def read_the_broken_file() -> bool:
            status(new)
            return any("keeping the current API keys" in r.getMessage() for r in caplog.records)

        eventually(read_the_broken_file, 10, 0.1, "the gateway read the half-written file")
        assert status(new) == 200 and status(old) == 401


def test_an_unusable_keys_file_fails_at_start(tmp_path: Path) -> None:
    keys_file = tmp_path / "auth-keys"
    with pytest.raises(KeysFileError, match="auth-keys"):
        Authenticator(AuthSettings(enabled=True, keys_file=str(keys_file)))
    _, digest = new_key()
    keys_file.write_text(json.dumps([{"name": "a", "hash": digest}, {"name": "b", "hash": digest}]))
    with pytest.raises(KeysFileError, match="duplicate hash"):
        Authenticator(AuthSettings(enabled=True, keys_file=str(keys_file)))


def test_reloads_at_most_once_per_interval(tmp_path: Path) -> None:
    now = [0.0]
    key, digest = new_key()
    keys_file = tmp_path / "auth-keys"
    _write(keys_file, team=digest)
    auth = Authenticator(
        AuthSettings(enabled=True, keys_file=str(keys_file), keys_reload_seconds=5),
        clock=lambda: now[0],
    )
    assert auth.authenticate(f"Bearer {key}").name == "team"
    _write(keys_file)
    now[0] = 4.9
    assert auth.authenticate(f"Bearer {key}").name == "team"
    now[0] = 5.0
    with pytest.raises(OpenAIError, match="Incorrect API key"):
        auth.authenticate(f"Bearer {key}")
