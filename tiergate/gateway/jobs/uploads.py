"""Workspace uploads (``POST /v1/jobs/workspaces``) as the calling key's own cost; a
batch's tasks file (``POST /v1/jobs/batches/tasks``, tiergate.gateway.jobs.taskfile) is an
upload of another kind (:data:`BATCH_TASKS`), under the same quota, count and time to live.

An upload counts as one request against the key's requests per minute, as a job
submission does. A key holds at most ``jobs.max_uploads_per_key`` live uploads and
``jobs.upload_quota_bytes`` of them (429 ``upload_quota_exceeded`` past either, checked
before the body is read, and again with its real size before it is stored). An upload
lives ``jobs.upload_ttl_seconds``: after that no new job (or replay) may name it (400
``upload_expired``), and it no longer counts against the quota.

The body is never held in memory: it is read from the ASGI stream in chunks and written
to a temporary file as it comes (413 once it is over ``jobs.max_upload_bytes``), the tar
is checked from that file by streaming through its headers (``tarfile`` mode ``r|*``, the
member list dropped as it goes: at most ``jobs.max_upload_members`` members whose sizes
sum to at most ``jobs.max_upload_unpacked_bytes``, else 400 naming the limit), and the
file is sent to object storage in parts. A refused upload stores nothing and counts for
nothing in the quota. A replica receives at most ``jobs.max_concurrent_uploads`` at once
(503 ``upload_capacity`` past it), which bounds its temporary directory.

Expired uploads are deleted lazily, by this key's next upload, once they are also past a
grace period (:meth:`Uploads.grace_seconds`) in which a job accepted just before the
expiry can still start and be retried. For keys that stop uploading, the bucket can do the
same with an S3 lifecycle rule on the uploads prefix, e.g. (``{prefix}`` is
``jobs.storage.prefix``; rules count whole days, so round the TTL plus the grace up)::

    {"Rules": [{"ID": "tiergate-uploads", "Status": "Enabled",
                "Filter": {"Prefix": "{prefix}uploads/"},
                "Expiration": {"Days": 2}}]}
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any

from fastapi import Request

from tiergate.gateway.access.auth import Caller
from tiergate.gateway.access.gatekeeper import Gatekeeper
from tiergate.gateway.errors import OpenAIError
from tiergate.gateway.jobs.tarcheck import ArchiveRefused, CheckLimits, CheckStopped, check_tar
from tiergate.gateway.jobs.taskfile import check_tasks
from tiergate.gateway.jobs.threads import JobThreads
from tiergate.jobs.state.store import JobStore, StorageError
from tiergate.jobsettings import JobsSettings

# Runs a store call in a thread; a StorageError becomes the 503 every jobs route answers.
Storage = Callable[..., Awaitable[Any]]
# A read charged to the caller's read budget: (caller, fn, *args) (JobsAPI.read).
Reads = Callable[..., Awaitable[Any]]

# Chunks from the ASGI stream are gathered to this size before one write to disk (in a
# thread), so that a body of many small chunks costs few thread hops.
_WRITE_BYTES = 1024 * 1024
_DISCONNECT_POLL_SECONDS = 0.5
_UPLOAD_ID = re.compile(r"upl_[0-9a-f]{32}")


def _too_large(limit: int, setting: str = "max_upload_bytes") -> OpenAIError:
    return OpenAIError(
        413,
        f"The upload exceeds {limit} bytes, this installation's limit (jobs.{setting}: {limit}).",
        code="request_too_large",
    )


@dataclass(frozen=True)
class UploadKind:
    """What an upload holds: the answer's ``object``, its size limit (the setting's
    name), what an empty body is told, and the check of its spooled body (the answer's
    figures, or an OpenAIError)."""

    object: str
    limit_setting: str
    empty: str
    check: Callable[[IO[bytes], JobsSettings, threading.Event], dict[str, int]]

    def limit(self, settings: JobsSettings) -> int:
        return min(settings.max_upload_bytes, int(getattr(settings, self.limit_setting)))


def _check_workspace(file: IO[bytes], s: JobsSettings, cancel: threading.Event) -> dict[str, int]:
    limits = CheckLimits(
        max_members=s.max_upload_members,
        max_unpacked=s.max_upload_unpacked_bytes,
        max_ratio=s.max_upload_ratio,
        seconds=s.upload_check_seconds,
    )
    try:
        return {"members": check_tar(file, limits, cancel).members}
    except ArchiveRefused as exc:
        raise OpenAIError(400, str(exc), code=exc.code) from None


def _check_tasks(file: IO[bytes], s: JobsSettings, cancel: threading.Event) -> dict[str, int]:
    return {"tasks": check_tasks(file)}


WORKSPACE = UploadKind(
    "workspace.upload", "max_upload_bytes", "send a tar archive as the body", _check_workspace
)
BATCH_TASKS = UploadKind(
    "jobs.batch_tasks", "max_batch_tasks_bytes", "send the tasks as JSON lines", _check_tasks
)


class SpoolSlots:
    """This replica's transfers that spool a file to its temporary directory: workspace
    and task-file uploads, files received and files served. One count for all of them, so
    that ``jobs.max_concurrent_uploads`` bounds the directory (503 ``upload_capacity``
    past it) and ``jobs.max_concurrent_uploads_per_key`` holds one key to its share (429
    ``too_many_concurrent_uploads``), whichever routes the transfers come through."""

    def __init__(self, settings: JobsSettings) -> None:
        self._settings = settings
        self._active = 0
        self._by_owner: dict[str, int] = {}
        # Taken on the event loop and, by batch finalization (room), in the storage threads.
        self._lock = threading.Lock()

    def take(self, owner: str, headers: dict[str, str], doing: str = "sending") -> None:
        """One slot for ``owner`` (``doing``: what the refusal says the key is doing)."""
        with self._lock:
            self._take(owner, headers, doing)

    @contextlib.contextmanager
    def room(self, owner: str) -> Iterator[bool]:
        """A slot for ``owner`` while the block runs, if one is free: True then, False
        (nothing held) when the replica or the key is at its limit. Batch finalization
        writes its files under it (tiergate.jobs.lines.finalize)."""
        try:
            self.take(owner, {}, doing="finalizing")
        except OpenAIError:
            yield False
            return
        try:
            yield True
        finally:
            self.release(owner)

    def _take(self, owner: str, headers: dict[str, str], doing: str) -> None:
        s = self._settings
        if self._active >= s.max_concurrent_uploads:
            raise OpenAIError(
                503,
                f"This gateway is receiving {s.max_concurrent_uploads} uploads, its limit "
                "(jobs.max_concurrent_uploads); retry shortly.",
                code="upload_capacity",
                type_="server_error",
                headers={"retry-after": "2", **headers},
            )
        own = self._by_owner.get(owner, 0)
        if own >= s.max_concurrent_uploads_per_key:
            raise OpenAIError(
                429,
                f"This key is {doing} {own} files through this gateway, its most at once "
                f"(jobs.max_concurrent_uploads_per_key: {s.max_concurrent_uploads_per_key}); "
                "retry when one has finished.",
                code="too_many_concurrent_uploads",
                type_="rate_limit_error",
                headers={"retry-after": "2", **headers},
            )
        self._active += 1
        self._by_owner[owner] = own + 1

    def release(self, owner: str) -> None:
        with self._lock:
            self._active -= 1
            self._by_owner[owner] -= 1
            if not self._by_owner[owner]:
                del self._by_owner[owner]


class Uploads:
    """Receives, checks, stores, deletes and looks up one gateway's workspace uploads."""

    def __init__(
        self,
        settings: JobsSettings,
        store: JobStore,
        gatekeeper: Gatekeeper,
        storage: Storage,
        slots: SpoolSlots,
        threads: JobThreads,
    ) -> None:
        self._settings = settings
        self._threads = threads
        self._store = store
        self._gatekeeper = gatekeeper
        self._storage = storage
        # The sizes of each key's uploads this replica is receiving now (declared, then
        # real): counted with the stored ones, so that parallel uploads from one key cannot
        # all pass the quota at once.
        self._receiving: dict[str, list[int]] = {}
        self._slots = slots
        # One event per check running now: set when its client leaves or the gateway closes.
        self._checks: set[threading.Event] = set()
        self._closing = False

    def close(self) -> None:
        """Stop every check still running (each within one chunk): nothing a request
        started keeps the process from shutting down."""
        self._closing = True
        for cancel in list(self._checks):
            cancel.set()

    def grace_seconds(self) -> float:
        """How long past its expiry an upload is kept: a job accepted just before the
        expiry is started, or failed by the sweep, within two ``requeue_after_seconds``,
        and runs (with its retries) for at most ``max_attempts`` times its timeout cap."""
        jobs = self._settings
        return 2 * jobs.requeue_after_seconds + (
            jobs.worker.max_attempts * jobs.caps.timeout_seconds
        )

    # -- receiving --------------------------------------------------------------------------

    async def receive(
        self, caller: Caller, request: Request, kind: UploadKind = WORKSPACE
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """Take one upload for ``caller``: the answer's body and rate-limit headers, once it
        is stored."""
        s = self._settings
        limit = kind.limit(s)
        declared = request.headers.get("content-length")
        expected = int(declared) if declared is not None and declared.isdigit() else 0
        if expected > limit:
            raise _too_large(limit, kind.limit_setting)
        upload_id = f"upl_{uuid.uuid4().hex}"
        headers = await self._gatekeeper.count_request(caller, upload_id)
        self._slots.take(caller.owner, headers)
        # Counted as being received before the quota is looked at, so that parallel uploads
        # from one key each see the others.
        receiving = self._receiving.setdefault(caller.owner, [])
        receiving.append(expected)
        try:
            await self._check_quota(caller, headers)
            with tempfile.NamedTemporaryFile(prefix="tiergate-upload-") as spool:
                size = await self._spool(request, spool, limit, kind.limit_setting)
                if size == 0:
                    raise OpenAIError(
                        400, f"The upload is empty: {kind.empty}.", code="invalid_upload"
                    )
                summary = await self._check(kind, spool, request)
                receiving.remove(expected)
                receiving.append(size)
                expected = size
                await self._check_quota(caller, headers)
                await self._storage(
                    self._store.put_upload_file, caller.owner, upload_id, spool.name
                )
        finally:
            self._slots.release(caller.owner)
            receiving.remove(expected)
            if not receiving:
                self._receiving.pop(caller.owner, None)
        answer = {
            "id": upload_id,
            "object": kind.object,
            "bytes": size,
            **summary,
            "expires_at": int(time.time() + s.upload_ttl_seconds),
        }
        return answer, headers

    async def _check(self, kind: UploadKind, spool: IO[bytes], request: Request) -> dict[str, int]:
        """``kind.check`` of the spooled body, in a thread, stopped as soon as the client has
        gone (looked at every :data:`_DISCONNECT_POLL_SECONDS`) or the gateway closes."""
        cancel = threading.Event()
        self._checks.add(cancel)
        check = asyncio.ensure_future(
            self._threads.check(kind.check, spool, self._settings, cancel)
        )
        try:
            while not check.done():
                await asyncio.wait({check}, timeout=_DISCONNECT_POLL_SECONDS)
                if self._closing or (not check.done() and await request.is_disconnected()):
                    cancel.set()
            return check.result()
        except CheckStopped:
            if self._closing:
                raise OpenAIError(
                    503,
                    "This gateway is shutting down; send the upload again.",
                    code="upload_capacity",
                    type_="server_error",
                    headers={"retry-after": "2"},
                ) from None
            raise OpenAIError(
                400, "The client closed the connection.", code="client_disconnected"
            ) from None
        finally:
            cancel.set()  # also when this request is cancelled (a graceful shutdown's end)
            self._checks.discard(cancel)

    async def _spool(self, request: Request, spool: IO[bytes], limit: int, setting: str) -> int:
        """Copy the body to ``spool`` chunk by chunk; 413 as soon as it is over ``limit``."""
        size = 0
        pending = bytearray()
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(limit, setting)
            pending += chunk
            if len(pending) >= _WRITE_BYTES:
                await self._threads.store(spool.write, pending)
                pending = bytearray()
        if pending:
            await self._threads.store(spool.write, pending)
        await self._threads.store(spool.flush)
        return size

    # -- the quota --------------------------------------------------------------------------

    async def _check_quota(self, caller: Caller, headers: dict[str, str]) -> None:
        """429 when ``caller``'s live uploads (stored, plus those this replica is receiving,
        this one among them) are over its number or bytes; deletes the expired ones past
        their grace on the way."""
        stored: list[tuple[str, int, float]] = await self._storage(
            self._store.uploads, caller.owner
        )
        s = self._settings
        ttl = s.upload_ttl_seconds
        live = [size for _, size, age in stored if age < ttl]
        receiving = self._receiving.get(caller.owner, [])
        count = len(live) + len(receiving)
        total = sum(live) + sum(receiving)
        if count > s.max_uploads_per_key:
            raise _quota(
                f"This key holds {s.max_uploads_per_key} live uploads, its limit "
                f"(jobs.max_uploads_per_key: {s.max_uploads_per_key}).",
                headers,
            )
        if total > s.upload_quota_bytes:
            raise _quota(
                f"This upload would take this key's live uploads to {total} bytes, over its "
                f"quota (jobs.upload_quota_bytes: {s.upload_quota_bytes}).",
                headers,
            )
        for name, _, age in stored:
            if age >= ttl + self.grace_seconds():
                with contextlib.suppress(StorageError):
                    await asyncio.to_thread(self._store.delete_upload, caller.owner, name)

    # -- naming, deleting -------------------------------------------------------------------

    async def check_named(self, caller: Caller, upload_id: str, status: int, param: str) -> None:
        """Refuse (``status``) an upload a job names that this key does not have, or that
        expired."""
        age: float | None = await self._storage(self._store.upload_age, caller.owner, upload_id)
        if age is None:
            raise OpenAIError(
                status,
                f"No workspace upload {upload_id!r} for this key (POST /v1/jobs/workspaces).",
                param=param,
                code="upload_not_found",
            )
        ttl = self._settings.upload_ttl_seconds
        if age >= ttl:
            raise OpenAIError(
                status,
                f"The workspace upload {upload_id!r} expired: an upload may be named by new "
                f"jobs for {ttl:g} seconds (jobs.upload_ttl_seconds). Upload it again.",
                param=param,
                code="upload_expired",
            )

    async def delete(self, caller: Caller, upload_id: str) -> dict[str, Any]:
        """Delete one of ``caller``'s uploads (freeing its quota); 404 when it has none by
        that id. A job already accepted that names it fails when it starts."""
        if not _UPLOAD_ID.fullmatch(upload_id) or (
            await self._storage(self._store.upload_age, caller.owner, upload_id) is None
        ):
            raise OpenAIError(
                404,
                f"No workspace upload {upload_id!r} for this key.",
                param="upload_id",
                code="upload_not_found",
            )
        await self._storage(self._store.delete_upload, caller.owner, upload_id)
        return {"id": upload_id, "object": "workspace.upload", "deleted": True}


def _quota(message: str, headers: dict[str, str]) -> OpenAIError:
    return OpenAIError(
        429,
        message + " Wait for one to expire, or delete one (DELETE /v1/jobs/workspaces/{id}).",
        code="upload_quota_exceeded",
        type_="rate_limit_error",
        headers={"retry-after": "60", **headers},
    )
