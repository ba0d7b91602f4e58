"""Job state and artifacts in S3-compatible object storage: the one place every gateway
replica and worker reads, so that no job lives only in one process's memory.

Layout under ``{prefix}``:

    {id}/spec.json        the request, as accepted
    {id}/status.json      the job object, updated as it runs
    {id}/events/NNNNNNNN.json   status changes and steps, numbered from 1, each written
                          once (If-None-Match), so two writers never overwrite an event
    {id}/deliveries/NNNN  one per pickup by a worker (survives redelivery)
    {id}/cancel           present once cancellation was asked for
    {id}/runs/NNNN[.beat] each run's lease and heartbeat (tiergate.jobs.state.lease)
    {id}/run-NNNN/artifacts/...   trajectory.jsonl, verifier.log, workspace.tar.gz of run
                          NNNN (the terminal record's ``run`` names the one that counts;
                          jobs of before leases: {id}/artifacts/...)
    {id}/result.json      the terminal job object, written once (If-None-Match: *), last
    index/{owner}/{13-digit inverted ms}_{id}   newest first, for listing
    pending/{owner}/{id}  present while the job is not finished (outstanding-job caps,
                          and the sweep that re-sends a job whose message was lost)
    uploads/{owner}/{id}.tar    starting workspaces a key uploaded (only its own are read)
    idempotency/{owner}/{sha256}  the job a client's Idempotency-Key created

This module owns that layout; the reads and writes, their conditions and their errors
are :class:`tiergate.objectstore.ObjectStore`'s: every failure (unreachable, bucket gone,
refused) is a :class:`StorageError` whose message names no bucket or key (it reaches API
callers), and a bucket that disappeared is created again on demand.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tiergate.jobs.state.lease import Leases
from tiergate.jobsettings import StorageSettings
from tiergate.objectstore import ObjectStore, StorageError
from tiergate.protocol import Job, JobCreate

# How long a writer waits before trying an event number again that was refused while
# nothing could be read there (a write still landing).
_UNSEEN_RETRY_SECONDS = 0.05

__all__ = ["ARTIFACTS", "JobStore", "StorageError"]

ARTIFACTS = {
    "trajectory": "artifacts/trajectory.jsonl",
    "verifier_log": "artifacts/verifier.log",
    "workspace": "artifacts/workspace.tar.gz",
    "result": "result.json",
}
_INVERT = 10**15


class JobStore:
    """The jobs' keys over one :class:`ObjectStore` (:attr:`objects`, which the
    environment registry and the breakers lay their own keys over)."""

    def __init__(self, settings: StorageSettings) -> None:
        self.objects = ObjectStore(settings)
        self._prefix = settings.prefix

    def _key(self, job_id: str, name: str) -> str:
        return f"{self._prefix}{job_id}/{name}"

    def prefixed(self, rel: str) -> str:
        """``rel`` under this store's prefix (for the layouts laid beside the jobs': the
        batches', tiergate.jobs.batches.store)."""
        return f"{self._prefix}{rel}"

    def ensure_bucket(self) -> None:
        self.objects.ensure_bucket()

    def leases(self, ttl: float) -> Leases:
        """The runs' leases over this layout (one per worker: it watches and beats them)."""
        return Leases(self.objects, self._key, ttl)

    # -- jobs -------------------------------------------------------------------------------

    def _index_key(self, job: Job) -> str:
        inverted = _INVERT - int(job.created_at_ms)
        return f"{self._prefix}index/{job.owner}/{inverted:015d}_{job.id}"

    def _pending_key(self, owner: str, job_id: str) -> str:
        return f"{self._prefix}pending/{owner}/{job_id}"

    def create(self, job: Job, spec: JobCreate) -> bool:
        """Record a new job; False when a job with its id is recorded already. The pending
        marker (what the sweep and the outstanding cap count), the spec and the listing entry
        are written first, the status record last and only if absent (``If-None-Match``): a
        gateway that dies part way leaves a marker without a record, which the sweep removes
        once it has watched it so for ``requeue_after_seconds``, never a queued job the sweep
        cannot find. Two creates given one id (one ``Idempotency-Key``, one spec) race at the
        status record; only the one whose record lands enqueues the job, and the other takes
        back its own listing entry."""
        self.objects.put(self._pending_key(job.owner, job.id), str(job.created_at).encode())
        self.objects.put(self._key(job.id, "spec.json"), spec.model_dump_json().encode())
        index = self._index_key(job)
        self.objects.put(index, b"")
        if self.objects.put_once(
            self._key(job.id, "status.json"),
            job.model_dump_json().encode(),
            content_type="application/json",
        ):
            return True
        winner = self.get(job.id)
        if winner is None or self._index_key(winner) != index:
            with contextlib.suppress(StorageError):
                self.objects.delete(index)
        return False

    def complete(self, job: Job, spec: JobCreate) -> None:
        """Write again what :meth:`create` writes before the record, for a recorded job
        (an idempotent retry of a create that may have died part way, before this order:
        its record found, its marker perhaps not)."""
        self.objects.put(self._pending_key(job.owner, job.id), str(job.created_at).encode())
        if self.objects.get(self._key(job.id, "spec.json")) is None:
            self.objects.put(self._key(job.id, "spec.json"), spec.model_dump_json().encode())
        self.objects.put(self._index_key(job), b"")

    def delete(self, job: Job) -> None:
        """Undo :meth:`create` (the job was never enqueued); best effort."""
        for key in (
            self._index_key(job),
            self._pending_key(job.owner, job.id),
            self._key(job.id, "status.json"),
            self._key(job.id, "spec.json"),
        ):
            with contextlib.suppress(StorageError):
                self.objects.delete(key)

    def put_status(self, job: Job) -> None:
        self.objects.put(
            self._key(job.id, "status.json"),
            job.model_dump_json().encode(),
            content_type="application/json",
        )

    def final(self, job_id: str) -> Job | None:
        raw = self.objects.get(self._key(job_id, "result.json"))
        return Job.model_validate_json(raw) if raw is not None else None

    def get(self, job_id: str) -> Job | None:
        raw = self.objects.get(self._key(job_id, "status.json"))
        if raw is None:
            return None
        job = Job.model_validate_json(raw)
        if not job.status.terminal:
            # The terminal record is written before the status view: trust it if present.
            return self.final(job_id) or job
        return job

    def spec(self, job_id: str) -> JobCreate | None:
        raw = self.objects.get(self._key(job_id, "spec.json"))
        return JobCreate.model_validate_json(raw) if raw is not None else None

    def finalize(self, job: Job) -> bool:
        """Write the terminal record once. False when another writer got there first."""
        body = job.model_dump_json().encode()
        if not self.objects.put_once(
            self._key(job.id, "result.json"), body, content_type="application/json"
        ):
            return False
        self.put_status(job)
        with contextlib.suppress(StorageError):
            self.objects.delete(self._pending_key(job.owner, job.id))
        self.unmark_running(job.owner, job.id)
        return True

    def list_jobs(self, owner: str, after: str | None, limit: int) -> tuple[list[Job], bool]:
        prefix = f"{self._prefix}index/{owner}/"
        start = ""
        if after:
            anchor = self.get(after)
            if anchor is None or anchor.owner != owner:
                return [], False
            start = self._index_key(anchor)
        keys = self.objects.keys(prefix, start, limit + 1)
        jobs = []
        for key in keys[:limit]:
            job = self.get(key.rsplit("/", 1)[1].split("_", 1)[1])
            # An entry that is not the record's own (left by a create that died before its
            # record, then retried with the same Idempotency-Key) lists nothing.
            if job is not None and self._index_key(job) == key:
                jobs.append(job)
        return jobs, len(keys) > limit

    def _running_key(self, owner: str, job_id: str) -> str:
        return f"{self._prefix}running/{owner}/{job_id}"

    def mark_running(self, owner: str, job_id: str) -> None:
        """Count the job among its owner's running ones (tiergate.jobs.state.share)."""
        self.objects.put(self._running_key(owner, job_id), b"")

    def unmark_running(self, owner: str, job_id: str) -> None:
        with contextlib.suppress(StorageError):
            self.objects.delete(self._running_key(owner, job_id))

    def running_by_owner(self) -> dict[str, set[str]]:
        """The running markers: owner -> job ids."""
        root = f"{self._prefix}running/"
        found: dict[str, set[str]] = {}
        for page in self.objects.pages(root):
            for key in page:
                owner, _, job_id = key.removeprefix(root).rpartition("/")
                found.setdefault(owner, set()).add(job_id)
        return found

    def outstanding(self, owner: str, limit: int) -> int:
        """How many of ``owner``'s jobs are unfinished (counting up to ``limit``)."""
        return len(self.objects.keys(f"{self._prefix}pending/{owner}/", limit=limit))

    def pending(self) -> Iterator[tuple[str, str]]:
        """(owner, job id) of every unfinished job."""
        root = f"{self._prefix}pending/"
        for page in self.objects.pages(root):
            for key in page:
                owner, _, job_id = key.removeprefix(root).rpartition("/")
                yield owner, job_id

    # -- idempotency, deliveries, cancellation ----------------------------------------------

    def claim_idempotency(self, owner: str, digest: str, job_id: str) -> str:
        """Bind a client's idempotency key to ``job_id``; the job it names if already bound."""
        key = f"{self._prefix}idempotency/{owner}/{digest}"
        if self.objects.put_once(key, job_id.encode()):
            return job_id
        raw = self.objects.get(key)
        return raw.decode() if raw else job_id

    def release_idempotency(self, owner: str, digest: str) -> None:
        with contextlib.suppress(StorageError):
            self.objects.delete(f"{self._prefix}idempotency/{owner}/{digest}")

    def deliveries(self, job_id: str) -> int:
        """How many pickups of the job are recorded."""
        return len(self.objects.keys(self._key(job_id, "deliveries/")))

    def record_delivery(self, job_id: str, seen: int | None = None) -> int:
        """Count one more pickup of the job, whichever worker it is; returns its number.
        ``seen``: what :meth:`deliveries` just returned (saves listing them again; a
        concurrent pickup that took the next number moves this one past it)."""
        prefix = self._key(job_id, "deliveries/")
        number = (self.deliveries(job_id) if seen is None else seen) + 1
        while not self.objects.put_once(f"{prefix}{number:04d}", str(time.time()).encode()):
            number += 1
        return number

    def forget_delivery(self, job_id: str, number: int) -> None:
        """A pickup handed back on purpose (a draining worker) does not count."""
        with contextlib.suppress(StorageError):
            self.objects.delete(self._key(job_id, f"deliveries/{number:04d}"))

    def mark_resent(self, job_id: str, at: float | None = None) -> bool:
        """Claim the one re-send a job may get (False: someone already re-sent it)."""
        stamp = time.time() if at is None else at
        return self.objects.put_once(self._key(job_id, "resent"), str(stamp).encode())

    def resent_at(self, job_id: str) -> float | None:
        raw = self.objects.get(self._key(job_id, "resent"))
        return float(raw) if raw else None

    def drop_pending(self, owner: str, job_id: str) -> None:
        with contextlib.suppress(StorageError):
            self.objects.delete(self._pending_key(owner, job_id))

    def request_cancel(self, job_id: str) -> None:
        self.objects.put(self._key(job_id, "cancel"), b"")

    def cancel_requested(self, job_id: str) -> bool:
        return self.objects.get(self._key(job_id, "cancel")) is not None

    # -- events -----------------------------------------------------------------------------

    def append_event(self, job_id: str, event: dict[str, Any], after: int = 0) -> int:
        """Add an event after the last one; returns its sequence number. Each number is
        written once, so a second writer moves to the next number instead of overwriting."""
        sequence = max(after, 0) + 1
        for _ in range(1000):
            body = json.dumps({**event, "sequence_number": sequence}).encode()
            if self.objects.put_once(self._key(job_id, f"events/{sequence:08d}.json"), body):
                return sequence
            sequence = self.last_sequence(job_id) + 1
        raise StorageError("object storage: could not append an event")

    def append_event_once(self, job_id: str, event: dict[str, Any], after: int = 0) -> int:
        """Add an event a job has one of (its terminal event) unless one of its type is
        there already; returns the number it has. Writers of it (the one that ended the
        job, one that found the job ended without it) all aim at the lowest free number
        and, on finding a number taken, read what took it: the first to land is the only
        one, and a write that landed but whose answer was lost is found, not repeated.
        ``after``: a number no later than any such event there may be (0 when unknown)."""
        kind, sequence = event["type"], max(after, 0) + 1
        for _ in range(1000):
            body = json.dumps({**event, "sequence_number": sequence}).encode()
            if self.objects.put_once(self._key(job_id, f"events/{sequence:08d}.json"), body):
                return sequence
            since = self.events(job_id, sequence - 1)
            for seen in since:
                if seen["type"] == kind:
                    return int(seen["sequence_number"])
            taken = {int(e["sequence_number"]) for e in since}
            if sequence in taken:
                while sequence in taken:  # on to the lowest number not seen taken
                    sequence += 1
            else:
                # Refused, yet nothing is there: a concurrent write still landing (S3
                # answers the loser 409 ConditionalRequestConflict) or one that failed.
                # Never past a number whose holder is unseen: the same one, after a moment.
                time.sleep(_UNSEEN_RETRY_SECONDS)
        raise StorageError("object storage: could not append an event")

    def last_sequence(self, job_id: str) -> int:
        keys = self.objects.keys(self._key(job_id, "events/"))
        return int(keys[-1].rsplit("/", 1)[1].split(".")[0]) if keys else 0

    def events(self, job_id: str, after: int) -> list[dict[str, Any]]:
        prefix = self._key(job_id, "events/")
        start = f"{prefix}{after:08d}.json" if after > 0 else ""
        return [
            json.loads(raw)
            for key in self.objects.keys(prefix, start)
            if (raw := self.objects.get(key)) is not None
        ]

    # -- artifacts and uploads --------------------------------------------------------------

    def _artifact_key(self, job_id: str, name: str, run: int | None) -> str:
        rel = ARTIFACTS[name]
        if name == "result" or not run:
            return self._key(job_id, rel)
        return self._key(job_id, f"run-{run:04d}/{rel}")

    def _run_of(self, job_id: str, run: int | None) -> int | None:
        if run is not None:
            return run
        final = self.final(job_id)
        return None if final is None else final.run

    def put_artifact(self, job_id: str, name: str, body: bytes, run: int | None = None) -> None:
        """Store run ``run``'s artifact ``name`` (None: a job of before leases)."""
        self.objects.put(self._artifact_key(job_id, name, run), body)

    def put_artifact_file(self, job_id: str, name: str, path: Path, run: int | None = None) -> None:
        """Store an artifact from a file on disk (the workspace's archive, up to the job's
        disk limit), streamed: multipart above 8 MiB, never whole in memory."""
        self.objects.put_file(self._artifact_key(job_id, name, run), path)

    def read_artifact(self, job_id: str, name: str, run: int | None = None) -> bytes | None:
        """A job's artifact (one of :data:`ARTIFACTS`) from run ``run`` (None: the run its
        terminal record names), or None when it was never stored."""
        return self.objects.get(self._artifact_key(job_id, name, self._run_of(job_id, run)))

    def artifact_urls(self, job_id: str, run: int | None = None) -> dict[str, str]:
        """Presigned URLs of run ``run``'s artifacts (None: the terminal record's run)."""
        run = self._run_of(job_id, run)
        base = self._key(job_id, f"run-{run:04d}/" if run else "")
        present = set(self.objects.keys(base + "artifacts/"))
        present |= set(self.objects.keys(self._key(job_id, "result.json")))
        urls = {}
        for name in ARTIFACTS:
            key = self._artifact_key(job_id, name, run)
            if key in present:
                urls[name] = self.objects.presigned_url(key)
        return urls

    def _upload_key(self, owner: str, upload_id: str) -> str:
        return f"{self._prefix}uploads/{owner}/{upload_id}.tar"

    def put_upload(self, owner: str, upload_id: str, body: bytes) -> None:
        self.objects.put(self._upload_key(owner, upload_id), body)

    def put_upload_file(self, owner: str, upload_id: str, path: str) -> None:
        """Store an upload from a file on disk, streamed (see
        :meth:`ObjectStore.put_file`)."""
        self.objects.put_file(self._upload_key(owner, upload_id), Path(path))

    def has_upload(self, owner: str, upload_id: str) -> bool:
        return bool(self.objects.keys(self._upload_key(owner, upload_id), limit=1))

    def upload_age(self, owner: str, upload_id: str) -> float | None:
        """Seconds since the upload was stored (the store's clock), or None when it does
        not exist (a HEAD: nothing is read)."""
        stored = self.objects.modified(self._upload_key(owner, upload_id))
        return None if stored is None else time.time() - stored

    def uploads(self, owner: str) -> list[tuple[str, int, float]]:
        """(upload id, bytes, age in seconds) of each of ``owner``'s uploads."""
        root = f"{self._prefix}uploads/{owner}/"
        now = time.time()
        return [
            (listed.key.removeprefix(root).removesuffix(".tar"), listed.size, now - listed.modified)
            for listed in self.objects.listing(root)
        ]

    def delete_upload(self, owner: str, upload_id: str) -> None:
        self.objects.delete(self._upload_key(owner, upload_id))

    def read_upload(self, owner: str, upload_id: str) -> bytes | None:
        """A starting workspace: only ever one the job's own owner uploaded."""
        return self.objects.get(self._upload_key(owner, upload_id))

    def read_upload_to(self, owner: str, upload_id: str, path: Path) -> bool:
        """:meth:`read_upload` into the file ``path``, a chunk at a time (an upload may be
        as large as ``jobs.max_upload_bytes``); False when it does not exist."""
        return self.objects.get_file(self._upload_key(owner, upload_id), path)
