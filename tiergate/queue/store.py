"""Job state and artifacts in S3-compatible object storage: the one place every gateway
replica and worker reads, so that no job lives only in one process's memory.

Layout under ``{prefix}``:

    {id}/spec.json        the request, as accepted
    {id}/status.json      the job object, updated as it runs
    {id}/events/NNNNNNNN.json   status changes and steps, numbered from 1
    {id}/cancel           present once cancellation was asked for
    {id}/artifacts/...    trajectory.jsonl, verifier.log, workspace.tar.gz
    {id}/result.json      the terminal job object, written once (If-None-Match: *), last
    index/{owner}/{13-digit inverted ms}_{id}   newest first, for listing
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from tiergate.queue.schema import Job, JobCreate
from tiergate.settings import StorageSettings

ARTIFACTS = {
    "trajectory": "artifacts/trajectory.jsonl",
    "verifier_log": "artifacts/verifier.log",
    "workspace": "artifacts/workspace.tar.gz",
    "result": "result.json",
}
_INVERT = 10**13


class StorageError(Exception):
    """Object storage failed (transient as far as a job is concerned)."""


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
                retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=3, read_timeout=10
            ),
        )

    # -- plumbing ---------------------------------------------------------------------------

    def _key(self, job_id: str, name: str) -> str:
        return f"{self._prefix}{job_id}/{name}"

    def _put(self, key: str, body: bytes, **extra: Any) -> None:
        try:
            self._s3.put_object(Bucket=self._bucket, Key=key, Body=body, **extra)
        except ClientError as exc:
            raise StorageError(f"put {key}: {exc}") from exc

    def _get(self, key: str) -> bytes | None:
        try:
            return bytes(self._s3.get_object(Bucket=self._bucket, Key=key)["Body"].read())
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise StorageError(f"get {key}: {exc}") from exc

    def _list(self, prefix: str, start_after: str = "", limit: int = 1000) -> list[str]:
        try:
            kwargs: dict[str, Any] = {"Bucket": self._bucket, "Prefix": prefix, "MaxKeys": limit}
            if start_after:
                kwargs["StartAfter"] = start_after
            page = self._s3.list_objects_v2(**kwargs)
        except ClientError as exc:
            raise StorageError(f"list {prefix}: {exc}") from exc
        return [item["Key"] for item in page.get("Contents", [])]

    def ensure_bucket(self) -> None:
        try:
            self._s3.head_bucket(Bucket=self._bucket)
        except ClientError:
            try:
                self._s3.create_bucket(Bucket=self._bucket)
            except ClientError as exc:
                raise StorageError(f"bucket {self._bucket}: {exc}") from exc

    # -- jobs -------------------------------------------------------------------------------

    def _index_key(self, job: Job) -> str:
        inverted = _INVERT - job.created_at * 1000
        return f"{self._prefix}index/{job.owner}/{inverted:013d}_{job.id}"

    def create(self, job: Job, spec: JobCreate) -> None:
        self._put(self._key(job.id, "spec.json"), spec.model_dump_json().encode())
        self.put_status(job)
        self._put(self._index_key(job), b"")

    def delete(self, job: Job) -> None:
        """Undo :meth:`create` (the job was never enqueued)."""
        for key in (
            self._key(job.id, "spec.json"),
            self._key(job.id, "status.json"),
            self._index_key(job),
        ):
            with contextlib.suppress(ClientError):
                self._s3.delete_object(Bucket=self._bucket, Key=key)

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
        try:
            self._s3.put_object(
                Bucket=self._bucket,
                Key=self._key(job.id, "result.json"),
                Body=job.model_dump_json().encode(),
                IfNoneMatch="*",
                ContentType="application/json",
            )
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (
                409,
                412,
            ):
                return False
            raise StorageError(f"finalize {job.id}: {exc}") from exc
        self.put_status(job)
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

    # -- cancellation, events, artifacts ----------------------------------------------------

    def request_cancel(self, job_id: str) -> None:
        self._put(self._key(job_id, "cancel"), b"")

    def cancel_requested(self, job_id: str) -> bool:
        return self._get(self._key(job_id, "cancel")) is not None

    def append_event(self, job_id: str, sequence: int, event: dict[str, Any]) -> None:
        body = json.dumps({**event, "sequence_number": sequence}).encode()
        self._put(self._key(job_id, f"events/{sequence:08d}.json"), body)

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

    def put_artifact(self, job_id: str, name: str, body: bytes) -> None:
        self._put(self._key(job_id, ARTIFACTS[name]), body)

    def artifact_urls(self, job_id: str) -> dict[str, str]:
        present = set(self._list(self._key(job_id, "")))
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

    def read_object(self, url: str) -> bytes:
        """Read ``s3://bucket/key`` (a starting workspace)."""
        bucket, _, key = url.removeprefix("s3://").partition("/")
        try:
            return bytes(self._s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        except ClientError as exc:
            raise StorageError(f"read {url}: {exc}") from exc
