"""A batch's keys, beside the jobs' in the jobs bucket (:class:`JobStore`'s prefix):

    batches/{owner}/{id}/request.json   the batch as accepted, written once
    batches/{owner}/{id}/state.json     the batch as its scheduler last wrote it (its
                                        lease's holder only: tiergate.jobs.state.lease)
    batches/{owner}/{id}/cancel         present once cancelled
    batches/{owner}/{id}/policy_version the latest version a trainer announced
    batches/{owner}/{id}/runs/NNNN      the scheduler's lease
    batches-active/{owner}/{id}         present while the batch is not finished

The owner is in every key, so that a key reads only its own batches.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from tiergate.jobs.state.store import JobStore
from tiergate.objectstore import StorageError
from tiergate.protocol.batches import Batch, BatchCreate


class BatchStore:
    def __init__(self, store: JobStore) -> None:
        self.jobs = store
        self._objects = store.objects

    @staticmethod
    def lease_id(owner: str, batch_id: str) -> str:
        """The id its scheduler's lease is taken on (Leases lays runs/ under it)."""
        return f"batches/{owner}/{batch_id}"

    def _key(self, owner: str, batch_id: str, name: str) -> str:
        return self.jobs.prefixed(f"batches/{owner}/{batch_id}/{name}")

    def _active(self, owner: str, batch_id: str) -> str:
        return self.jobs.prefixed(f"batches-active/{owner}/{batch_id}")

    def create(self, batch: Batch, request: bytes | Path, owner_cap: int) -> bool:
        """``request``: the batch's :class:`BatchCreate` as JSON, or a file of it (sent a
        part at a time, never read whole)."""
        key = self._key(batch.owner, batch.id, "request.json")
        if isinstance(request, Path):
            with request.open("rb") as body:
                written = self._objects.put_once(key, body)
        else:
            written = self._objects.put_once(key, request)
        if not written:
            return False
        self.put_state(batch)
        self._objects.put(self._active(batch.owner, batch.id), str(owner_cap).encode())
        return True

    def request(self, owner: str, batch_id: str) -> BatchCreate | None:
        raw = self._objects.get(self._key(owner, batch_id, "request.json"))
        return None if raw is None else BatchCreate.model_validate_json(raw)

    def state(self, owner: str, batch_id: str) -> Batch | None:
        raw = self._objects.get(self._key(owner, batch_id, "state.json"))
        return None if raw is None else Batch.model_validate_json(raw)

    def state_reader(self, owner: str, batch_id: str) -> Callable[[], Batch | None]:
        """:meth:`state` for one reader that asks again and again (an event stream): each
        read after the first asks the store for the state only if it changed (its ETag),
        and hands back the batch it parsed last when it has not, so that a large batch's
        state is neither sent nor parsed again while nothing happens to it."""
        key = self._key(owner, batch_id, "state.json")
        last: tuple[str, Batch] | None = None

        def read() -> Batch | None:
            nonlocal last
            got = self._objects.get_unless(key, last[0] if last else None)
            if got is None:
                last = None
                return None
            body, etag = got
            if body is None and last is not None:
                return last[1]
            assert body is not None
            last = (etag, Batch.model_validate_json(body))
            return last[1]

        return read

    def put_state(self, batch: Batch, body: bytes | None = None) -> None:
        """``body``: the batch already serialized."""
        self._objects.put(
            self._key(batch.owner, batch.id, "state.json"),
            body if body is not None else batch.model_dump_json().encode(),
            content_type="application/json",
        )

    def owner_cap(self, owner: str, batch_id: str) -> int | None:
        raw = self._objects.get(self._active(owner, batch_id))
        return None if raw is None else int(raw)

    def finished(self, owner: str, batch_id: str) -> None:
        with contextlib.suppress(StorageError):
            self._objects.delete(self._active(owner, batch_id))

    def active_of(self, owner: str, limit: int) -> int:
        """How many of ``owner``'s batches are not finished (counted up to ``limit``)."""
        return len(self._objects.keys(self.jobs.prefixed(f"batches-active/{owner}/"), limit=limit))

    def active(self) -> Iterator[tuple[str, str]]:
        """(owner, batch id) of every batch not finished."""
        root = self.jobs.prefixed("batches-active/")
        for page in self._objects.pages(root):
            for key in page:
                owner, _, batch_id = key.removeprefix(root).rpartition("/")
                yield owner, batch_id

    def request_cancel(self, owner: str, batch_id: str) -> None:
        self._objects.put(self._key(owner, batch_id, "cancel"), b"")

    def announce_policy_version(self, owner: str, batch_id: str, version: int) -> None:
        self._objects.put(self._key(owner, batch_id, "policy_version"), str(version).encode())

    def announced_policy_version(self, owner: str, batch_id: str) -> int | None:
        raw = self._objects.get(self._key(owner, batch_id, "policy_version"))
        return None if raw is None else int(raw.decode())

    def cancel_requested(self, owner: str, batch_id: str) -> bool:
        return self._objects.get(self._key(owner, batch_id, "cancel")) is not None
