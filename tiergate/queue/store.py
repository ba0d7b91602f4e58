"""Job state and artifacts in S3-compatible object storage: the one place every gateway
replica and worker reads, so that no job lives only in one process's memory.

Layout under ``{prefix}``:

    {id}/spec.json        the request, as accepted
    {id}/status.json      the job object, updated as it runs
    {id}/events/NNNNNNNN.json   status changes and steps, numbered from 1, each written
                          once (If-None-Match), so two writers never overwrite an event
    {id}/deliveries/NNNN  one per pickup by a worker (survives redelivery)
    {id}/cancel           present once cancellation was asked for
    {id}/artifacts/...    trajectory.jsonl, verifier.log, workspace.tar.gz
    {id}/result.json      the terminal job object, written once (If-None-Match: *), last
    index/{owner}/{13-digit inverted ms}_{id}   newest first, for listing
    pending/{owner}/{id}  present while the job is not finished (outstanding-job caps,
                          and the sweep that re-sends a job whose message was lost)
    uploads/{owner}/{id}.tar    starting workspaces a key uploaded (only its own are read)
    idempotency/{owner}/{sha256}  the job a client's Idempotency-Key created

Errors: every failure of the store (unreachable, bucket gone, refused) is a
:class:`StorageError` whose message names no bucket or key (it reaches API callers); the
details go to the log. A bucket that disappeared (an in-memory server restarted, or an
operator's mistake) is created again on demand.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import boto3
from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from tiergate.protocol import Job, JobCreate
from tiergate.settings import StorageSettings

log = logging.getLogger("tiergate.store")

ARTIFACTS = {
    "trajectory": "artifacts/trajectory.jsonl",
    "verifier_log": "artifacts/verifier.log",
    "workspace": "artifacts/workspace.tar.gz",
    "result": "result.json",
}
_INVERT = 10**15
# Artifact files go up in parts of 8 MiB, two at a time: ``upload_file`` reads each part
# from the file as it is sent, so what a worker holds does not grow with the artifact.
_PARTS = TransferConfig(
    multipart_threshold=8 * 1024 * 1024, multipart_chunksize=8 * 1024 * 1024, max_concurrency=2
)
_T = TypeVar("_T")


class StorageError(Exception):
    """Object storage failed (transient as far as a job is concerned)."""


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _conflict(exc: ClientError) -> bool:
    return _code(exc) in ("PreconditionFailed", "ConditionalRequestConflict") or _status(exc) in (
        409,
        412,
    )


def _missing(exc: ClientError) -> bool:
    return _code(exc) in ("NoSuchKey", "404", "NotFound")


class JobStore:
    def __init__(self, settings: StorageSettings) -> None:
        self._settings = settings
        self._bucket = settings.bucket
        self._prefix = settings.prefix
        self._s3 = boto3.client(
            "s3",
            endpoint_url=settings.endpoint_url,
            region_name=settings.region,
            config=Config(
                retries={"max_attempts": 2, "mode": "standard"},
                connect_timeout=settings.timeout_seconds,
                read_timeout=max(10.0, settings.timeout_seconds),
            ),
        )

    # -- plumbing ---------------------------------------------------------------------------

    def _call(self, what: str, fn: Callable[[], _T]) -> _T:
        """Run one S3 call; a vanished bucket is created again and the call retried once."""
        for attempt in (1, 2):
            try:
                return fn()
            except ClientError as exc:
                if _code(exc) == "NoSuchBucket" and attempt == 1:
                    self.ensure_bucket()
                    continue
                log.warning("object storage: %s failed: %s", what, exc)
                raise StorageError(f"object storage refused a {what} ({_code(exc)})") from exc
            except BotoCoreError as exc:
                log.warning("object storage: %s failed: %s", what, exc)
                raise StorageError(f"object storage is unreachable ({type(exc).__name__})") from exc
        raise AssertionError("unreachable")

    def _key(self, job_id: str, name: str) -> str:
        return f"{self._prefix}{job_id}/{name}"

    def _put(self, key: str, body: bytes, **extra: Any) -> None:
        self._call(
            "write", lambda: self._s3.put_object(Bucket=self._bucket, Key=key, Body=body, **extra)
        )

    def _put_once(self, key: str, body: bytes, **extra: Any) -> bool:
        """Write ``key`` only if it does not exist; False when it did."""

        def put() -> bool:
            try:
                self._s3.put_object(
                    Bucket=self._bucket, Key=key, Body=body, IfNoneMatch="*", **extra
                )
            except ClientError as exc:
                if _conflict(exc):
                    return False
                raise
            return True

        return self._call("write", put)

    def _get(self, key: str) -> bytes | None:
        def get() -> bytes | None:
            try:
                return bytes(self._s3.get_object(Bucket=self._bucket, Key=key)["Body"].read())
            except ClientError as exc:
                if _missing(exc):
                    return None
                raise

        return self._call("read", get)

    def exists(self, key: str) -> bool:
        """Whether ``key`` is stored (a HEAD: nothing is read)."""

        def head() -> bool:
            try:
                self._s3.head_object(Bucket=self._bucket, Key=key)
            except ClientError as exc:
                if _missing(exc):
                    return False
                raise
            return True

        return self._call("read", head)

    def _delete(self, key: str) -> None:
        self._call("delete", lambda: self._s3.delete_object(Bucket=self._bucket, Key=key))

    def _pages(self, prefix: str, start_after: str = "") -> Iterator[list[str]]:
        """Every key under ``prefix``, a page (up to 1,000) at a time, in key order."""
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self._bucket, "Prefix": prefix}
            if token:
                kwargs["ContinuationToken"] = token
            elif start_after:
                kwargs["StartAfter"] = start_after
            page: dict[str, Any] = self._call("listing", functools.partial(self._list_page, kwargs))
            yield [item["Key"] for item in page.get("Contents", [])]
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    def _list_page(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        page: dict[str, Any] = self._s3.list_objects_v2(**kwargs)
        return page

    def _list(self, prefix: str, start_after: str = "", limit: int | None = None) -> list[str]:
        keys: list[str] = []
        for page in self._pages(prefix, start_after):
            keys += page
            if limit is not None and len(keys) >= limit:
                return keys[:limit]
        return keys

    def ensure_bucket(self) -> None:
        try:
            self._s3.head_bucket(Bucket=self._bucket)
            return
        except ClientError:
            pass
        except BotoCoreError as exc:
            raise StorageError(f"object storage is unreachable ({type(exc).__name__})") from exc
        try:
            self._s3.create_bucket(Bucket=self._bucket)
        except ClientError as exc:
            if _code(exc) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                log.warning("object storage: creating the bucket failed: %s", exc)
                raise StorageError(f"object storage refused the bucket ({_code(exc)})") from exc
        except BotoCoreError as exc:
            raise StorageError(f"object storage is unreachable ({type(exc).__name__})") from exc

    # -- jobs -------------------------------------------------------------------------------

    def _index_key(self, job: Job) -> str:
        inverted = _INVERT - int(job.created_at_ms)
        return f"{self._prefix}index/{job.owner}/{inverted:015d}_{job.id}"

    def _pending_key(self, owner: str, job_id: str) -> str:
        return f"{self._prefix}pending/{owner}/{job_id}"

    def create(self, job: Job, spec: JobCreate) -> None:
        self._put(self._key(job.id, "spec.json"), spec.model_dump_json().encode())
        self.put_status(job)
        self._put(self._pending_key(job.owner, job.id), str(job.created_at).encode())
        self._put(self._index_key(job), b"")

    def delete(self, job: Job) -> None:
        """Undo :meth:`create` (the job was never enqueued); best effort."""
        for key in (
            self._index_key(job),
            self._pending_key(job.owner, job.id),
            self._key(job.id, "status.json"),
            self._key(job.id, "spec.json"),
        ):
            with contextlib.suppress(StorageError):
                self._delete(key)

    def put_status(self, job: Job) -> None:
        self._put(
            self._key(job.id, "status.json"),
            job.model_dump_json().encode(),
            ContentType="application/json",
        )

    def final(self, job_id: str) -> Job | None:
        raw = self._get(self._key(job_id, "result.json"))
        return Job.model_validate_json(raw) if raw is not None else None

    def get(self, job_id: str) -> Job | None:
        raw = self._get(self._key(job_id, "status.json"))
        if raw is None:
            return None
        job = Job.model_validate_json(raw)
        if not job.status.terminal:
            # The terminal record is written before the status view: trust it if present.
            return self.final(job_id) or job
        return job

    def spec(self, job_id: str) -> JobCreate | None:
        raw = self._get(self._key(job_id, "spec.json"))
        return JobCreate.model_validate_json(raw) if raw is not None else None

    def finalize(self, job: Job) -> bool:
        """Write the terminal record once. False when another writer got there first."""
        body = job.model_dump_json().encode()
        if not self._put_once(
            self._key(job.id, "result.json"), body, ContentType="application/json"
        ):
            return False
        self.put_status(job)
        with contextlib.suppress(StorageError):
            self._delete(self._pending_key(job.owner, job.id))
        return True

    def list_jobs(self, owner: str, after: str | None, limit: int) -> tuple[list[Job], bool]:
        prefix = f"{self._prefix}index/{owner}/"
        start = ""
        if after:
            anchor = self.get(after)
            if anchor is None or anchor.owner != owner:
                return [], False
            start = self._index_key(anchor)
        keys = self._list(prefix, start, limit + 1)
        ids = [key.rsplit("/", 1)[1].split("_", 1)[1] for key in keys[:limit]]
        jobs = [job for job_id in ids if (job := self.get(job_id))]
        return jobs, len(keys) > limit

    def outstanding(self, owner: str, limit: int) -> int:
        """How many of ``owner``'s jobs are unfinished (counting up to ``limit``)."""
        return len(self._list(f"{self._prefix}pending/{owner}/", limit=limit))

    def pending(self) -> Iterator[tuple[str, str]]:
        """(owner, job id) of every unfinished job."""
        root = f"{self._prefix}pending/"
        for page in self._pages(root):
            for key in page:
                owner, _, job_id = key.removeprefix(root).rpartition("/")
                yield owner, job_id

    # -- idempotency, deliveries, cancellation ----------------------------------------------

    def claim_idempotency(self, owner: str, digest: str, job_id: str) -> str:
        """Bind a client's idempotency key to ``job_id``; the job it names if already bound."""
        key = f"{self._prefix}idempotency/{owner}/{digest}"
        if self._put_once(key, job_id.encode()):
            return job_id
        raw = self._get(key)
        return raw.decode() if raw else job_id

    def release_idempotency(self, owner: str, digest: str) -> None:
        with contextlib.suppress(StorageError):
            self._delete(f"{self._prefix}idempotency/{owner}/{digest}")

    def deliveries(self, job_id: str) -> int:
        """How many pickups of the job are recorded."""
        return len(self._list(self._key(job_id, "deliveries/")))

    def record_delivery(self, job_id: str, seen: int | None = None) -> int:
        """Count one more pickup of the job, whichever worker it is; returns its number.
        ``seen``: what :meth:`deliveries` just returned (saves listing them again; a
        concurrent pickup that took the next number moves this one past it)."""
        prefix = self._key(job_id, "deliveries/")
        number = (self.deliveries(job_id) if seen is None else seen) + 1
        while not self._put_once(f"{prefix}{number:04d}", str(time.time()).encode()):
            number += 1
        return number

    def forget_delivery(self, job_id: str, number: int) -> None:
        """A pickup handed back on purpose (a draining worker) does not count."""
        with contextlib.suppress(StorageError):
            self._delete(self._key(job_id, f"deliveries/{number:04d}"))

    def mark_resent(self, job_id: str, at: float | None = None) -> bool:
        """Claim the one re-send a job may get (False: someone already re-sent it)."""
        stamp = time.time() if at is None else at
        return self._put_once(self._key(job_id, "resent"), str(stamp).encode())

    def resent_at(self, job_id: str) -> float | None:
        raw = self._get(self._key(job_id, "resent"))
        return float(raw) if raw else None

    def drop_pending(self, owner: str, job_id: str) -> None:
        with contextlib.suppress(StorageError):
            self._delete(self._pending_key(owner, job_id))

    def request_cancel(self, job_id: str) -> None:
        self._put(self._key(job_id, "cancel"), b"")

    def cancel_requested(self, job_id: str) -> bool:
        return self._get(self._key(job_id, "cancel")) is not None

    # -- events -----------------------------------------------------------------------------

    def append_event(self, job_id: str, event: dict[str, Any], after: int = 0) -> int:
        """Add an event after the last one; returns its sequence number. Each number is
        written once, so a second writer moves to the next number instead of overwriting."""
        sequence = max(after, 0) + 1
        for _ in range(1000):
            body = json.dumps({**event, "sequence_number": sequence}).encode()
            if self._put_once(self._key(job_id, f"events/{sequence:08d}.json"), body):
                return sequence
            sequence = self.last_sequence(job_id) + 1
        raise StorageError("object storage: could not append an event")

    def last_sequence(self, job_id: str) -> int:
        keys = self._list(self._key(job_id, "events/"))
        return int(keys[-1].rsplit("/", 1)[1].split(".")[0]) if keys else 0

    def events(self, job_id: str, after: int) -> list[dict[str, Any]]:
        prefix = self._key(job_id, "events/")
        start = f"{prefix}{after:08d}.json" if after > 0 else ""
        return [
            json.loads(raw)
            for key in self._list(prefix, start)
            if (raw := self._get(key)) is not None
        ]

    # -- artifacts and uploads --------------------------------------------------------------

    def put_artifact(self, job_id: str, name: str, body: bytes) -> None:
        self._put(self._key(job_id, ARTIFACTS[name]), body)

    def put_artifact_file(self, job_id: str, name: str, path: Path) -> None:
        """Store an artifact from a file on disk (the workspace's archive, up to the job's
        disk limit), streamed: multipart above 8 MiB, never whole in memory."""
        self._put_file(self._key(job_id, ARTIFACTS[name]), path)

    def _put_file(self, key: str, path: Path) -> None:
        """Store ``key`` from the file ``path`` in parts of at most 8 MiB read from the
        file as they are sent (``upload_file`` reads it lazily; ``upload_fileobj`` would
        copy each part into memory): never whole in memory."""

        def put() -> None:
            try:
                self._s3.upload_file(str(path), self._bucket, key, Config=_PARTS)
            except S3UploadFailedError as exc:
                # boto3 wraps the ClientError: unwrapped, a vanished bucket is made again
                # and the write retried, and the error is a StorageError as any other.
                cause = exc.__cause__ or exc.__context__
                if isinstance(cause, ClientError | BotoCoreError):
                    raise cause from None
                log.warning("object storage: a multipart write failed: %s", exc)
                raise StorageError("object storage refused a write") from exc

        self._call("write", put)

    def _get_file(self, key: str, path: Path) -> bool:
        """Write ``key`` to the file ``path`` a chunk at a time; False when it is not
        stored."""

        def get() -> bool:
            try:
                body = self._s3.get_object(Bucket=self._bucket, Key=key)["Body"]
            except ClientError as exc:
                if _missing(exc):
                    return False
                raise
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as out:
                for chunk in body.iter_chunks(1024 * 1024):
                    out.write(chunk)
            return True

        return self._call("read", get)

    def read_artifact(self, job_id: str, name: str) -> bytes | None:
        """A job's artifact (one of :data:`ARTIFACTS`), or None when it was never stored."""
        return self._get(self._key(job_id, ARTIFACTS[name]))

    def artifact_urls(self, job_id: str) -> dict[str, str]:
        present = set(self._list(self._key(job_id, "artifacts/")))
        present |= set(self._list(self._key(job_id, "result.json")))
        urls = {}
        for name, rel in ARTIFACTS.items():
            key = self._key(job_id, rel)
            if key in present:
                urls[name] = self._s3.generate_presigned_url(
                    "get_object",
                    Params={"Bucket": self._bucket, "Key": key},
                    ExpiresIn=self._settings.presign_seconds,
                )
        return urls

    def _upload_key(self, owner: str, upload_id: str) -> str:
        return f"{self._prefix}uploads/{owner}/{upload_id}.tar"

    def put_upload(self, owner: str, upload_id: str, body: bytes) -> None:
        self._put(self._upload_key(owner, upload_id), body)

    def put_upload_file(self, owner: str, upload_id: str, path: str) -> None:
        """Store an upload from a file on disk, streamed (see :meth:`_put_file`)."""
        self._put_file(self._upload_key(owner, upload_id), Path(path))

    def has_upload(self, owner: str, upload_id: str) -> bool:
        return bool(self._list(self._upload_key(owner, upload_id), limit=1))

    def upload_age(self, owner: str, upload_id: str) -> float | None:
        """Seconds since the upload was stored (the store's clock), or None when it does
        not exist (a HEAD: nothing is read)."""
        key = self._upload_key(owner, upload_id)

        def head() -> float | None:
            try:
                meta = self._s3.head_object(Bucket=self._bucket, Key=key)
            except ClientError as exc:
                if _missing(exc) or _status(exc) == 404:
                    return None
                raise
            age: float = time.time() - meta["LastModified"].timestamp()
            return age

        return self._call("read", head)

    def uploads(self, owner: str) -> list[tuple[str, int, float]]:
        """(upload id, bytes, age in seconds) of each of ``owner``'s uploads."""
        root = f"{self._prefix}uploads/{owner}/"
        found: list[tuple[str, int, float]] = []
        token: str | None = None
        now = time.time()
        while True:
            kwargs: dict[str, Any] = {"Bucket": self._bucket, "Prefix": root}
            if token:
                kwargs["ContinuationToken"] = token
            page = self._call("listing", functools.partial(self._list_page, kwargs))
            for item in page.get("Contents", []):
                name = str(item["Key"]).removeprefix(root).removesuffix(".tar")
                age = now - item["LastModified"].timestamp()
                found.append((name, int(item["Size"]), age))
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return found

    def delete_upload(self, owner: str, upload_id: str) -> None:
        self._delete(self._upload_key(owner, upload_id))

    def read_upload(self, owner: str, upload_id: str) -> bytes | None:
        """A starting workspace: only ever one the job's own owner uploaded."""
        return self._get(self._upload_key(owner, upload_id))

    def read_upload_to(self, owner: str, upload_id: str, path: Path) -> bool:
        """:meth:`read_upload` into the file ``path``, a chunk at a time (an upload may be
        as large as ``jobs.max_upload_bytes``); False when it does not exist."""
        return self._get_file(self._upload_key(owner, upload_id), path)
