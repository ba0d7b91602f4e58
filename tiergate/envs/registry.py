"""Environments in object storage, beside the jobs (under the jobs storage prefix):

- ``<prefix>envs/blobs/<digest>.tar``: a built root file system, uploaded once (multipart,
  :meth:`tiergate.objectstore.ObjectStore.upload`) and never changed: its key is its
  content's sha256, so a worker checks what it downloads against the key;
- ``<prefix>envs/names/<name>.json``: ``{name, digest, manifest, built_at, bytes,
  build_seconds}``; registering a name again points it at the new digest, the old blob
  stays (a job records the digest it ran in, and a replay runs in that one).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from tiergate.envs.build import Built
from tiergate.objectstore import ObjectStore, StorageError

# Blobs are root file systems (hundreds of MB): they move in parts of 64 MiB.
_PART_BYTES = 64 << 20


class Registered(BaseModel):
    name: str
    digest: str
    manifest: dict[str, Any]
    built_at: int
    bytes: int
    build_seconds: float


class Registry:
    """The environments' keys over the jobs' object store (the workers' one bucket)."""

    def __init__(self, store: ObjectStore) -> None:
        self._store = store
        self._root = f"{store.prefix}envs/"

    def blob_key(self, digest: str) -> str:
        return f"{self._root}blobs/{digest}.tar"

    def _name_key(self, name: str) -> str:
        return f"{self._root}names/{name}.json"

    def has_blob(self, digest: str) -> bool:
        return self._store.exists(self.blob_key(digest))

    def register(self, built: Built) -> Registered:
        """Upload the blob (unless that digest is stored already) and point the name at it."""
        if not self.has_blob(built.digest):
            try:
                self._store.upload(built.path, self.blob_key(built.digest), part_bytes=_PART_BYTES)
            except (StorageError, OSError) as exc:
                raise StorageError(f"the environment could not be uploaded: {exc}") from exc
        entry = Registered(
            name=built.manifest.name,
            digest=built.digest,
            manifest=built.manifest.model_dump(mode="json"),
            built_at=int(time.time()),
            bytes=built.bytes,
            build_seconds=round(built.seconds, 3),
        )
        self._store.put(
            self._name_key(entry.name),
            entry.model_dump_json().encode(),
            content_type="application/json",
        )
        return entry

    def resolve(self, name: str) -> Registered | None:
        raw = self._store.get(self._name_key(name))
        return None if raw is None else Registered.model_validate_json(raw)

    def list(self) -> list[Registered]:
        found = []
        for key in self._store.keys(f"{self._root}names/"):
            raw = self._store.get(key)
            if raw is not None:
                found.append(Registered.model_validate_json(raw))
        return sorted(found, key=lambda e: e.name)

    def download(self, digest: str, path: Path) -> None:
        """The blob to ``path``; :class:`StorageError` if it cannot be read."""
        try:
            self._store.download(self.blob_key(digest), path, part_bytes=_PART_BYTES)
        except (StorageError, OSError) as exc:
            raise StorageError(f"environment {digest[:12]} could not be fetched: {exc}") from exc
