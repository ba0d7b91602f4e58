"""Several tenants of one installation, for the hostile-tenant tests: each a key of its own
(so an owner of its own), and the workers' key that acts for job owners."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tiergate.accesssettings import ApiKey
from tiergate.gateway.access.auth import new_key


@dataclass
class Tenants:
    """Keys by name; :attr:`auth` is the gateway's ``auth`` settings tree, :attr:`worker`
    the workers' key (``jobs.worker.api_key``); :attr:`owners`, the owner id (a key's stable
    id, under which the store keeps its jobs and uploads) by name."""

    secrets: dict[str, str] = field(default_factory=dict)
    owners: dict[str, str] = field(default_factory=dict)
    auth: dict[str, Any] = field(default_factory=dict)
    worker: str = ""

    def headers(self, name: str) -> dict[str, str]:
        return {"authorization": f"Bearer {self.secrets[name]}"}


def tenants(*names: str, **limits: dict[str, Any]) -> Tenants:
    """Keys ``names`` (``limits[name]``: that key's limits) and a worker key."""
    out = Tenants()
    entries: list[dict[str, Any]] = []
    for name in names:
        key, digest = new_key()
        out.secrets[name] = key
        entry = {"name": name, "hash": digest, "limits": limits.get(name, {})}
        out.owners[name] = ApiKey.model_validate(entry).owner_id
        entries.append(entry)
    out.worker, digest = new_key()
    entries.append({"name": "workers", "hash": digest, "acts_for_job_owners": True})
    out.auth = {"enabled": True, "keys": entries}
    return out
