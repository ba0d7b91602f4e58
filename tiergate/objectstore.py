"""The one boundary to S3-compatible object storage. The jobs
(:class:`tiergate.jobs.state.store.JobStore`), the environments
(:class:`tiergate.envs.registry.Registry`) and the breakers
(:class:`tiergate.jobs.state.breaker.BreakerBoard`) each lay out their own keys under
:attr:`ObjectStore.prefix` and read and write them here, so boto3 is met in this module
only and its errors are translated once.

Errors, each raised ``from`` the boto3 or botocore error that caused it:

    StorageError   object storage failed (transient as far as a job is concerned)

Through the store's calls (get, put, the conditional puts, delete, HEAD, listing, the
streamed :meth:`ObjectStore.put_file` and :meth:`ObjectStore.get_file`) its message names
no bucket or key, because it reaches API callers; the detail goes to the log. A bucket
that disappeared (an in-memory server restarted, or an operator's mistake) is created
again and the call retried once. The environments' blobs move with
:meth:`ObjectStore.upload` and :meth:`ObjectStore.download` instead: one attempt, and the
message is the cause's own, for the operator who registers or the worker's log.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

import boto3
from boto3.exceptions import Boto3Error, S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from tiergate.jobsettings import StorageSettings

log = logging.getLogger("tiergate.store")

# Files the store streams go up in parts of 8 MiB, two at a time: ``upload_file`` reads
# each part from the file as it is sent, so what a worker holds does not grow with it.
_PARTS = TransferConfig(
    multipart_threshold=8 * 1024 * 1024, multipart_chunksize=8 * 1024 * 1024, max_concurrency=2
)
_T = TypeVar("_T")


class StorageError(Exception):
    """Object storage failed (transient as far as a job is concerned)."""


@dataclass(frozen=True)
class Listed:
    """One object as a listing shows it; ``modified`` is the store's clock (epoch s)."""

    key: str
    size: int
    modified: float


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


def _typed(content_type: str | None) -> dict[str, Any]:
    return {} if content_type is None else {"ContentType": content_type}


def _unreachable(exc: BotoCoreError) -> StorageError:
    return StorageError(f"object storage is unreachable ({type(exc).__name__})")


@contextlib.contextmanager
def _as_storage_error() -> Iterator[None]:
    """A single attempt's failure, its message the cause's (see the module's docstring)."""
    try:
        yield
    except (ClientError, BotoCoreError, Boto3Error) as exc:
        raise StorageError(str(exc)) from exc


@dataclass
class Meter:
    """What the store calls made in one thread cost while it was metered: the calls (each
    a request to the store: a GET, a page of a LIST, a HEAD, ...) and the bytes read."""

    calls: int = 0
    read_bytes: int = 0


class ObjectStore:
    """One bucket, through one boto3 client made from the storage settings. Keys are
    whole keys: each owner puts :attr:`prefix` before its own layout."""

    def __init__(self, settings: StorageSettings) -> None:
        self._settings = settings
        # The meter of the :meth:`metered` call running in each thread, if any.
        self._metering = threading.local()
        self.bucket = settings.bucket
        self.prefix = settings.prefix
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

    def metered(self, fn: Callable[..., _T], *args: Any) -> tuple[_T, Meter]:
        """``fn(*args)``, run here, and what its calls to this store cost (for a caller's
        read budget, tiergate.gateway.access.readcost). A failing ``fn`` raises as it would."""
        outer = getattr(self._metering, "meter", None)
        meter = Meter()
        self._metering.meter = meter
        try:
            return fn(*args), meter
        finally:
            self._metering.meter = outer
            if outer is not None:
                outer.calls += meter.calls
                outer.read_bytes += meter.read_bytes

    def _count(self, *, calls: int = 0, read_bytes: int = 0) -> None:
        meter: Meter | None = getattr(self._metering, "meter", None)
        if meter is not None:
            meter.calls += calls
            meter.read_bytes += read_bytes

    def _call(self, what: str, fn: Callable[[], _T]) -> _T:
        """Run one S3 call; a vanished bucket is created again and the call retried once."""
        self._count(calls=1)
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
                raise _unreachable(exc) from exc
        raise AssertionError("unreachable")

    def ensure_bucket(self) -> None:
        """Create the bucket unless it is there (a store's first use, or a lost bucket)."""
        try:
            self._s3.head_bucket(Bucket=self.bucket)
            return
        except ClientError:
            pass
        except BotoCoreError as exc:
            raise _unreachable(exc) from exc
        try:
            self._s3.create_bucket(Bucket=self.bucket)
        except ClientError as exc:
            if _code(exc) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                log.warning("object storage: creating the bucket failed: %s", exc)
                raise StorageError(f"object storage refused the bucket ({_code(exc)})") from exc
        except BotoCoreError as exc:
            raise _unreachable(exc) from exc

    # -- objects ----------------------------------------------------------------------------

    def _get_object(self, key: str) -> dict[str, Any] | None:
        try:
            got: dict[str, Any] = self._s3.get_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if _missing(exc):
                return None
            raise
        return got

    def get(self, key: str) -> bytes | None:
        """``key``'s content, or None when it is not stored."""

        def get() -> bytes | None:
            got = self._get_object(key)
            if got is None:
                return None
            body = bytes(got["Body"].read())
            self._count(read_bytes=len(body))
            return body

        return self._call("read", get)

    def get_range(self, key: str, start: int, end: int) -> bytes | None:
        """Bytes ``start``..``end`` (exclusive) of ``key``, or None when it is not stored."""
        if end <= start:
            return b""

        def get() -> bytes | None:
            try:
                got = self._s3.get_object(
                    Bucket=self.bucket, Key=key, Range=f"bytes={start}-{end - 1}"
                )
            except ClientError as exc:
                if _missing(exc):
                    return None
                raise
            body = bytes(got["Body"].read())
            self._count(read_bytes=len(body))
            return body

        return self._call("read", get)

    def get_unless(self, key: str, etag: str | None) -> tuple[bytes | None, str] | None:
        """``key``'s content and ETag, unless it still has ``etag`` (``If-None-Match``):
        then (None, ``etag``), nothing transferred; None when it is not stored."""

        def get() -> tuple[bytes | None, str] | None:
            condition = {"IfNoneMatch": etag} if etag else {}
            try:
                got = self._s3.get_object(Bucket=self.bucket, Key=key, **condition)
            except ClientError as exc:
                if etag and (_status(exc) == 304 or _code(exc) in ("304", "NotModified")):
                    return None, etag
                if _missing(exc):
                    return None
                raise
            body = bytes(got["Body"].read())
            self._count(read_bytes=len(body))
            return body, str(got["ETag"])

        return self._call("read", get)

    def get_tagged(self, key: str) -> tuple[bytes, str] | None:
        """``key``'s content and ETag (for :meth:`put_if`), or None when it is not stored."""

        def get() -> tuple[bytes, str] | None:
            got = self._get_object(key)
            if got is None:
                return None
            body = bytes(got["Body"].read())
            self._count(read_bytes=len(body))
            return body, str(got["ETag"])

        return self._call("read", get)

    def put(self, key: str, body: bytes, *, content_type: str | None = None) -> None:
        extra = _typed(content_type)
        self._call(
            "write", lambda: self._s3.put_object(Bucket=self.bucket, Key=key, Body=body, **extra)
        )

    def put_once(
        self, key: str, body: bytes | IO[bytes], *, content_type: str | None = None
    ) -> bool:
        """Write ``key`` only if it does not exist (``If-None-Match: *``); False when it did.
        ``body``: bytes, or a seekable file sent from its start a part at a time."""
        return self.put_if(key, body, None, content_type=content_type)

    def put_if(
        self,
        key: str,
        body: bytes | IO[bytes],
        etag: str | None,
        *,
        content_type: str | None = None,
    ) -> bool:
        """Write ``key`` only if it still has ``etag`` (``If-Match``; None: only if it does
        not exist); False when another writer changed (or, with an ETag, removed) it."""
        condition: dict[str, Any] = {"IfMatch": etag} if etag else {"IfNoneMatch": "*"}
        extra = _typed(content_type)

        def put() -> bool:
            if not isinstance(body, bytes):
                body.seek(0)  # again from its start when the call is tried again
            try:
                self._s3.put_object(Bucket=self.bucket, Key=key, Body=body, **condition, **extra)
            except ClientError as exc:
                if _conflict(exc) or (etag and _missing(exc)):
                    return False
                raise
            return True

        return self._call("write", put)

    def delete(self, key: str) -> None:
        self._call("delete", lambda: self._s3.delete_object(Bucket=self.bucket, Key=key))

    def _head(self, key: str) -> dict[str, Any] | None:
        def head() -> dict[str, Any] | None:
            try:
                meta: dict[str, Any] = self._s3.head_object(Bucket=self.bucket, Key=key)
            except ClientError as exc:
                if _missing(exc) or _status(exc) == 404:
                    return None
                raise
            return meta

        return self._call("read", head)

    def exists(self, key: str) -> bool:
        """Whether ``key`` is stored (a HEAD: nothing is read)."""
        return self._head(key) is not None

    def modified(self, key: str) -> float | None:
        """When ``key`` was stored (the store's clock, epoch seconds), or None when it is
        not (a HEAD: nothing is read)."""
        meta = self._head(key)
        return None if meta is None else float(meta["LastModified"].timestamp())

    def presigned_url(self, key: str) -> str:
        """A URL that reads ``key`` without credentials for ``storage.presign_seconds``."""
        url: str = self._s3.generate_presigned_url(
            "get_object",
            Params={"Bucket": self.bucket, "Key": key},
            ExpiresIn=self._settings.presign_seconds,
        )
        return url

    # -- listing ----------------------------------------------------------------------------

    def _contents(self, prefix: str, start_after: str) -> Iterator[list[dict[str, Any]]]:
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
            if token:
                kwargs["ContinuationToken"] = token
            elif start_after:
                kwargs["StartAfter"] = start_after
            page: dict[str, Any] = self._call(
                "listing", functools.partial(self._s3.list_objects_v2, **kwargs)
            )
            yield page.get("Contents", [])
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    def pages(self, prefix: str, start_after: str = "") -> Iterator[list[str]]:
        """Every key under ``prefix``, a page (up to 1,000) at a time, in key order."""
        for contents in self._contents(prefix, start_after):
            yield [item["Key"] for item in contents]

    def keys(self, prefix: str, start_after: str = "", limit: int | None = None) -> list[str]:
        """The keys under ``prefix`` after ``start_after``, in key order, up to ``limit``."""
        keys: list[str] = []
        for page in self.pages(prefix, start_after):
            keys += page
            if limit is not None and len(keys) >= limit:
                return keys[:limit]
        return keys

    def listing(self, prefix: str) -> Iterator[Listed]:
        """Every object under ``prefix`` with its size and time, in key order."""
        for contents in self._contents(prefix, ""):
            for item in contents:
                yield Listed(str(item["Key"]), int(item["Size"]), item["LastModified"].timestamp())

    # -- files ------------------------------------------------------------------------------

    def put_file(self, key: str, path: Path) -> None:
        """Store ``key`` from the file ``path`` in parts of at most 8 MiB read from the
        file as they are sent (``upload_file`` reads it lazily; ``upload_fileobj`` would
        copy each part into memory): never whole in memory."""

        def put() -> None:
            try:
                self._s3.upload_file(str(path), self.bucket, key, Config=_PARTS)
            except S3UploadFailedError as exc:
                # boto3 wraps the ClientError: unwrapped, a vanished bucket is made again
                # and the write retried, and the error is a StorageError as any other.
                cause = exc.__cause__ or exc.__context__
                if isinstance(cause, ClientError | BotoCoreError):
                    raise cause from None
                log.warning("object storage: a multipart write failed: %s", exc)
                raise StorageError("object storage refused a write") from exc

        self._call("write", put)

    def get_file(self, key: str, path: Path) -> bool:
        """Write ``key`` to the file ``path`` a chunk at a time; False when it is not
        stored."""

        def get() -> bool:
            got = self._get_object(key)
            if got is None:
                return False
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as out:
                for chunk in got["Body"].iter_chunks(1024 * 1024):
                    out.write(chunk)
                    self._count(read_bytes=len(chunk))
            return True

        return self._call("read", get)

    def upload(self, path: Path, key: str, *, part_bytes: int) -> None:
        """Store the file ``path`` as ``key`` with boto3's managed transfer, in parts of
        ``part_bytes`` (up to ten at a time), in one attempt (see the module's docstring)."""
        parts = TransferConfig(multipart_threshold=part_bytes, multipart_chunksize=part_bytes)
        with _as_storage_error():
            self._s3.upload_file(str(path), self.bucket, key, Config=parts)

    def download(self, key: str, path: Path, *, part_bytes: int) -> None:
        """``key`` to the file ``path``, as :meth:`upload` stores it."""
        parts = TransferConfig(multipart_threshold=part_bytes, multipart_chunksize=part_bytes)
        with _as_storage_error():
            self._s3.download_file(self.bucket, key, str(path), Config=parts)
