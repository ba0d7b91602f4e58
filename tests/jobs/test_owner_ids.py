"""A job's owner is its key's stable id, not the key's name (issue 33 item 6).

The attack: an operator revokes a key and later makes a new one with the same name (names
are labels: "ci", "team-a", reused at will). When owners were names, the new key's holder
inherited the old key's jobs, uploads and artifacts. Now they belong to the old key's id,
which no new random key can have; an operator who wants a replacement key to keep the
data says so with ``owner``. Through a real gateway (keys file reloaded, as the chart
mounts it), Kafka and S3."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.jobs.archives import tar_of
from tests.jobstack import jobs_stack
from tests.waiting import eventually
from tiergate.accesssettings import ApiKey
from tiergate.gateway.access.auth import new_key

RELOAD_SECONDS = 0.3


def _write_keys(path: Path, entries: list[dict[str, Any]]) -> None:
    """Replace the file the way the kubelet updates a Secret volume: a new file moved in."""
    fresh = path.with_suffix(".new")
    fresh.write_text(json.dumps(entries))
    fresh.replace(path)


def _workspace() -> bytes:
    return tar_of({"secret.txt": b"the old tenant's secret\n"}, "w:gz")


def _job(upload_id: str) -> dict[str, Any]:
    return {
        "model": MODEL,
        "instruction": "Print secret.txt.",
        "workspace": {"upload_id": upload_id},
        "verifier": {"command": "true"},
        "limits": {"max_steps": 1, "timeout_seconds": 30},
    }


def test_a_new_key_with_a_revoked_keys_name_inherits_nothing(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    old, old_hash = new_key()
    heir, heir_hash = new_key()
    successor, successor_hash = new_key()
    old_entry = {"name": "team-a", "hash": old_hash}
    old_owner = ApiKey.model_validate(old_entry).owner_id
    keys_file = tmp_path / "auth-keys"
    _write_keys(keys_file, [old_entry])
    auth = {"enabled": True, "keys_file": str(keys_file), "keys_reload_seconds": RELOAD_SECONDS}
    with jobs_stack(broker, s3, model, tmp_path, auth=auth) as stack:  # no worker: jobs wait

        def call(key: str, method: str, path: str, **kw: Any) -> httpx.Response:
            headers = {"authorization": f"Bearer {key}"}
            return httpx.request(method, f"{stack.base}{path}", headers=headers, **kw)

        uploaded = call(old, "POST", "/v1/jobs/workspaces", content=_workspace())
        assert uploaded.status_code == 200, uploaded.text
        upload_id = uploaded.json()["id"]
        created = call(old, "POST", "/v1/jobs", json=_job(upload_id))
        assert created.status_code == 200, created.text
        job_id = created.json()["id"]

        # Revoked; a new key given the same name.
        _write_keys(keys_file, [{"name": "team-a", "hash": heir_hash}])
        eventually(
            lambda: call(heir, "GET", "/v1/models").status_code == 200,
            10,
            what="the new key accepted",
        )
        assert call(old, "GET", "/v1/models").status_code == 401
        listed = call(heir, "GET", "/v1/jobs")
        assert listed.status_code == 200, listed.text
        assert listed.json()["data"] == []
        assert call(heir, "GET", f"/v1/jobs/{job_id}").status_code == 404
        assert call(heir, "GET", f"/v1/jobs/{job_id}/events").status_code == 404
        assert call(heir, "POST", f"/v1/jobs/{job_id}/cancel").status_code == 404
        theirs = call(heir, "POST", "/v1/jobs", json=_job(upload_id))
        assert theirs.status_code == 400, theirs.text
        assert theirs.json()["error"]["code"] == "upload_not_found"
        assert call(heir, "DELETE", f"/v1/jobs/workspaces/{upload_id}").status_code == 404

        # The operator's explicit choice: a replacement key that keeps the old one's data.
        _write_keys(
            keys_file,
            [{"name": "team-a-2", "hash": successor_hash, "owner": old_owner}],
        )
        eventually(
            lambda: call(successor, "GET", f"/v1/jobs/{job_id}").status_code == 200,
            10,
            what="the successor sees the old key's job",
        )
        assert [j["id"] for j in call(successor, "GET", "/v1/jobs").json()["data"]] == [job_id]
        assert call(heir, "GET", "/v1/models").status_code == 401
