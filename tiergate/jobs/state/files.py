"""The OpenAI Files API's layout in object storage, beside the jobs' (one key's files only
ever under its own owner)::

    files/{owner}/{file_id}/meta.json   the file object (id, bytes, created_at, filename,
                                        purpose, status), written after the content
    files/{owner}/{file_id}/content     the bytes, stored and read a part at a time
    files/{owner}/{file_id}/plan.json   a batch input's check, made once at upload
                                        (tiergate.gateway.jobs.openaibatch.inputfile.upload_plan)

A file exists once its ``meta.json`` does: a write that failed half-way leaves at most a
content object no listing shows. File ids sort by creation time (milliseconds, then random
hex), so a listing is the owner's keys in order, and only one page's objects are read.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import orjson

from tiergate.jobs.state.store import JobStore

_META = "meta.json"
_CONTENT = "content"
_PLAN = "plan.json"


def new_file_id(now: float | None = None) -> str:
    """``file-`` + 12 hex digits of milliseconds + 20 random: ordered by creation time."""
    millis = int((time.time() if now is None else now) * 1000)
    return f"file-{millis:012x}{uuid.uuid4().hex[:20]}"


class FileStore:
    """Each owner's files over the job store's object storage."""

    def __init__(self, store: JobStore) -> None:
        self._objects = store.objects
        self._root = store.prefixed("files/")

    def _key(self, owner: str, file_id: str, name: str) -> str:
        return f"{self._root}{owner}/{file_id}/{name}"

    def put(
        self, owner: str, meta: dict[str, Any], path: Path, plan: dict[str, Any] | None = None
    ) -> None:
        """Store the content from the file ``path`` (in parts) and its ``plan``, then the
        file object."""
        file_id = str(meta["id"])
        self._objects.put_file(self._key(owner, file_id, _CONTENT), path)
        if plan is not None:
            self._objects.put(
                self._key(owner, file_id, _PLAN),
                orjson.dumps(plan),
                content_type="application/json",
            )
        self._objects.put(
            self._key(owner, file_id, _META), orjson.dumps(meta), content_type="application/json"
        )

    def get(self, owner: str, file_id: str) -> dict[str, Any] | None:
        return self._read(owner, file_id, _META)

    def plan(self, owner: str, file_id: str) -> dict[str, Any] | None:
        """The check stored with a batch input at upload, if one was."""
        return self._read(owner, file_id, _PLAN)

    def _read(self, owner: str, file_id: str, name: str) -> dict[str, Any] | None:
        raw = self._objects.get(self._key(owner, file_id, name))
        if raw is None:
            return None
        found: dict[str, Any] = orjson.loads(raw)
        return found

    def content_to(self, owner: str, file_id: str, path: Path) -> bool:
        """The content into the file ``path``, a chunk at a time; False when missing."""
        return self._objects.get_file(self._key(owner, file_id, _CONTENT), path)

    def content_range(self, owner: str, file_id: str, start: int, end: int) -> bytes | None:
        """Bytes ``start``..``end`` of the content (a batch chunk's lines)."""
        return self._objects.get_range(self._key(owner, file_id, _CONTENT), start, end)

    def ids(self, owner: str) -> list[str]:
        """The ids of ``owner``'s files, oldest first (one LIST of the owner's keys)."""
        root = f"{self._root}{owner}/"
        return [
            key.removeprefix(root).removesuffix(f"/{_META}")
            for key in self._objects.keys(root)
            if key.endswith(f"/{_META}")
        ]

    def usage(self, owner: str) -> tuple[int, int]:
        """(files, bytes of content) ``owner`` holds."""
        root = f"{self._root}{owner}/"
        described: set[str] = set()
        sizes: dict[str, int] = {}
        for listed in self._objects.listing(root):
            file_id, _, name = listed.key.removeprefix(root).partition("/")
            if name == _META:
                described.add(file_id)
            elif name == _CONTENT:
                sizes[file_id] = listed.size
        return len(described), sum(sizes.get(file_id, 0) for file_id in described)

    def delete(self, owner: str, file_id: str) -> None:
        """The file object first (the file is gone from then on), then its content."""
        self._objects.delete(self._key(owner, file_id, _META))
        self._objects.delete(self._key(owner, file_id, _CONTENT))
        self._objects.delete(self._key(owner, file_id, _PLAN))
