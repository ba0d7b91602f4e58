"""What the tenant-cost tests share: keys with their limits, OpenAI's error envelope
checked exactly, and a workspace upload through a stack's gateway."""

from __future__ import annotations

from typing import Any

import httpx

from tests.jobstack import JobsStack
from tiergate.gateway.access.auth import new_key

MiB = 1024 * 1024


def keys_with_limits(
    *names: str, **limits: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Auth settings with one key per name (``limits``: a key's limits by name), and the
    headers of each. Each key's owner is set to its name, so the store's records are
    looked up by name here (keys' default owners are tested in test_owner_ids.py)."""
    keys, headers = [], {}
    for name in names:
        key, digest = new_key()
        keys.append({"name": name, "hash": digest, "owner": name, "limits": limits.get(name, {})})
        headers[name] = {"authorization": f"Bearer {key}"}
    return {"enabled": True, "keys": keys}, headers


def envelope(resp: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The OpenAI error of ``resp``, checked to be exactly the envelope with ``code``."""
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["code"] == code, error
    return error


def send_upload(stack: JobsStack, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{stack.base}/v1/jobs/workspaces", content=body, headers=headers)
