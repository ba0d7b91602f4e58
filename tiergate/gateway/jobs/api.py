"""The jobs API: ``/v1/jobs`` over the Kafka pipeline and the object-storage job store.

It mirrors OpenAI's background responses: create answers at once with ``queued`` (but only
after the broker acknowledged the job), poll ``GET /v1/jobs/{id}``, cancel idempotently,
and stream events with ``sequence_number`` (resume with ``starting_after``). With API keys
on, a job (and an uploaded workspace) exists only for the key that created it. Every
state change goes through :class:`JobLifecycle`; every storage or broker failure is a 503
with ``retry-after`` that names no bucket, key or address. What a tenant's uploads and
event streams may cost is bounded in :mod:`~tiergate.gateway.jobs.uploads` and
:mod:`~tiergate.gateway.jobs.eventstream`; a job whose queue message would be over
``jobs.kafka.max_request_size`` is a 413 before anything is written.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from typing import Any

import orjson
from fastapi import Request
from pydantic import ValidationError
from starlette.responses import Response

from tiergate.gateway.access.auth import Caller
from tiergate.gateway.access.gatekeeper import Gatekeeper
from tiergate.gateway.access.policy import Needs
from tiergate.gateway.access.readcost import ReadBudget
from tiergate.gateway.errors import OpenAIError
from tiergate.gateway.jobs.eventstream import EventStreams
from tiergate.gateway.jobs.reserve import Reservations, Ticket
from tiergate.gateway.jobs.threads import JobThreads
from tiergate.gateway.jobs.uploads import SpoolSlots, Uploads
from tiergate.gateway.openai.selection import parse_body, read_body, requested_tier
from tiergate.jobs.state.lifecycle import JobLifecycle
from tiergate.jobs.state.store import JobStore, StorageError
from tiergate.jobsettings import JobsSettings
from tiergate.protocol import Job, JobCreate, JobMessage, JobStatus
from tiergate.protocol.base import list_page
from tiergate.queue.pipeline import JobQueue, MessageTooLarge, QueueUnavailable

log = logging.getLogger("tiergate.gateway.jobs")

# The length of every job id (``job_`` and 32 hex digits): a spec's message is measured with
# one before the job has its own.
_SOME_JOB_ID = "job_" + "0" * 32


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(data), status_code=status, media_type="application/json", headers=headers
    )


def unavailable(what: str, exc: Exception) -> OpenAIError:
    return OpenAIError(
        503,
        f"The job {what} is unavailable ({exc}); nothing was changed. Retry later.",
        code=f"{what}_unavailable",
        type_="server_error",
        headers={"retry-after": "5"},
    )


def too_large_for_queue(exc: MessageTooLarge) -> OpenAIError:
    return OpenAIError(
        413,
        f"The job is {exc.size} bytes as a queue message, over this installation's limit of "
        f"{exc.limit} bytes (jobs.kafka.max_request_size); make the spec smaller (large "
        "workspaces go in an upload: POST /v1/jobs/workspaces).",
        code="request_too_large",
    )


def _invalid(exc: ValidationError) -> OpenAIError:
    first = exc.errors()[0]
    param = ".".join(str(p) for p in first["loc"]) or None
    return OpenAIError(400, f"{param}: {first['msg']}", param=param)


class JobsAPI:
    def __init__(
        self,
        settings: JobsSettings,
        store: JobStore,
        queue: JobQueue,
        gatekeeper: Gatekeeper,
        max_body_bytes: int,
        threads: JobThreads,
    ) -> None:
        """``threads``: the routes' own thread pools (the app's lifespan closes them)."""
        self.threads = threads
        self._settings = settings
        self._max_body_bytes = max_body_bytes
        self._store = store
        self._queue = queue
        self._jobs = JobLifecycle(store)
        self._reservations = Reservations()
        self._gatekeeper = gatekeeper
        # One count of the transfers that spool to this replica's disk (uploads, files).
        self.spool_slots = SpoolSlots(settings)
        self._uploads = Uploads(
            settings, store, gatekeeper, self.storage, self.spool_slots, threads
        )
        self.reads = ReadBudget(
            gatekeeper.limiter,
            store.objects,
            settings.read_units_per_minute,
            settings.max_reads_in_flight_per_key,
        )
        self.streams = EventStreams(
            store, threads.streams, settings.max_streams_per_key, unavailable, self.reads
        )

    def close(self) -> None:
        """Stop the work requests started that may still run (upload checks)."""
        self._uploads.close()

    async def storage(self, fn: Any, *args: Any) -> Any:
        try:
            return await self.threads.store(fn, *args)
        except StorageError as exc:
            raise unavailable("store", exc) from exc

    async def read(self, caller: Caller, fn: Any, *args: Any) -> Any:
        """A read of the caller's own jobs or batches: charged to its owner's read budget
        (tiergate.gateway.access.readcost; a 429 when spent)."""
        return await self.reads.read(caller, self.storage, fn, *args)

    def caller(self, request: Request) -> Caller:
        return self._gatekeeper.authenticate(request.headers.get("authorization"))

    async def _owned(self, request: Request, job_id: str) -> Job:
        caller = self.caller(request)
        job: Job | None = await self.read(caller, self._store.get, job_id)
        if job is None or job.owner != caller.owner:
            # Another key's job does not exist, as far as this key can tell.
            raise OpenAIError(
                404, f"No job with id {job_id!r}.", param="job_id", code="job_not_found"
            )
        return job

    async def _public(self, job: Job) -> dict[str, Any]:
        try:
            artifacts = await self.threads.store(self._store.artifact_urls, job.id, job.run)
        except StorageError:
            artifacts = {}
        return job.public(artifacts)

    # -- create -----------------------------------------------------------------------------

    def check_spec(self, caller: Caller, spec: JobCreate) -> None:
        tier = requested_tier(spec.service_tier)
        caps = self._settings.caps
        for name in ("max_steps", "timeout_seconds", "cpus", "memory_mb", "disk_mb"):
            asked, cap = getattr(spec.limits, name), getattr(caps, name)
            if asked > cap:
                raise OpenAIError(
                    400,
                    f"limits.{name}: {asked} is over this installation's cap ({cap}).",
                    param=f"limits.{name}",
                    code="limit_over_cap",
                )
        self._gatekeeper.check_model(caller, spec.model)
        # The job's model calls are decided per call by the tier policy, as any request's;
        # an explicitly asked tier the key may not use is refused now rather than later.
        if tier.tier is not None:
            self._gatekeeper.policy.decide(caller, tier, Needs("/v1/chat/completions"))
        self._check_size(caller, spec)

    def _check_size(self, caller: Caller, spec: JobCreate) -> None:
        """413 for a job whose message, in the largest form it takes (a retry's, a
        re-send's, a replay's), would be over the producer's limit: measured before the
        job is admitted, so that nothing is written and no limit is counted for it."""
        largest = JobMessage(
            id=_SOME_JOB_ID,
            owner=caller.owner,
            spec=spec,
            attempt=10**6,
            not_before=time.time() + 10**6 + 0.123456,
            resent=True,
            replay_of=_SOME_JOB_ID,
        )
        try:
            self._queue.check_size(largest)
        except MessageTooLarge as exc:
            raise too_large_for_queue(exc) from None

    async def check_upload(self, caller: Caller, upload_id: str, param: str) -> None:
        """400 when ``caller`` has no live upload ``upload_id``."""
        await self._uploads.check_named(caller, upload_id, 400, param)

    def outstanding_cap(self, caller: Caller) -> int:
        """How many unfinished jobs the key may have."""
        return (caller.key and caller.key.limits.max_outstanding_jobs) or (
            self._settings.max_outstanding_jobs
        )

    async def count(self, caller: Caller) -> dict[str, str]:
        """Count a submission against the key's requests per minute (429 when over); the
        rate-limit headers."""
        return await self._gatekeeper.count_request(caller, f"job_{uuid.uuid4().hex}")

    async def _admit(self, caller: Caller, ticket: Ticket) -> tuple[str, dict[str, str]]:
        """A new job's id and rate-limit headers, once the submission is counted against
        the key's requests per minute (429 when over) and its outstanding jobs, with the
        creates of the key that took their ticket first (tiergate.gateway.jobs.reserve), are
        under the cap (429 when at it): what create and replay both check."""
        job_id = f"job_{uuid.uuid4().hex}"
        headers = await self._gatekeeper.count_request(caller, job_id)
        cap = self.outstanding_cap(caller)
        stored = await self.storage(self._store.outstanding, caller.owner, cap)
        if stored + ticket.ahead() >= cap:
            raise OpenAIError(
                429,
                f"This key has {cap} unfinished jobs, its limit; wait for one to finish.",
                code="too_many_outstanding_jobs",
                type_="rate_limit_error",
                headers={"retry-after": "30", **headers},
            )
        return job_id, headers

    async def create(self, request: Request) -> Response:
        caller = self.caller(request)
        body = parse_body(await read_body(request, self._max_body_bytes))
        try:
            spec = JobCreate.model_validate(body)
        except ValidationError as exc:
            raise _invalid(exc) from None
        self.check_spec(caller, spec)
        if upload := spec.workspace.upload_id:
            await self._uploads.check_named(caller, upload, 400, "workspace.upload_id")
        with self._reservations.ticket(caller.owner) as ticket:
            return await self._create(request, caller, spec, ticket)

    async def _create(
        self, request: Request, caller: Caller, spec: JobCreate, ticket: Ticket
    ) -> Response:
        job_id, headers = await self._admit(caller, ticket)
        digest = None
        if idempotency := request.headers.get("idempotency-key"):
            digest = hashlib.sha256(f"{idempotency}\n{spec.model_dump_json()}".encode())
            digest_hex = digest.hexdigest()
            bound = await self.storage(
                self._store.claim_idempotency, caller.owner, digest_hex, job_id
            )
            if bound != job_id:
                existing = await self.storage(self._store.get, bound)
                if existing is not None:
                    if existing.status is JobStatus.QUEUED:
                        # Its create may have died before its marker was written (an older
                        # gateway's order): then the sweep would never find it.
                        await self.storage(self._store.complete, existing, spec)
                    return json_response(await self._public(existing), headers=headers)
                job_id = bound  # a retry of a create that failed before its record
        job = self._jobs.new_job(job_id, caller.owner, spec)
        try:
            created = await self.threads.store(self._jobs.create, job, spec)
        except StorageError as exc:
            await self._undo(job, digest)
            raise unavailable("store", exc) from exc
        if not created:
            # Another create with this Idempotency-Key recorded the job first: it enqueues
            # it, and this one answers with its job.
            return await self._created_by_another(job_id, headers)
        await self._enqueue(job, JobMessage(id=job.id, owner=job.owner, spec=spec), digest)
        return json_response(job.public({}), headers=headers)

    async def _enqueue(self, job: Job, message: JobMessage, digest: Any) -> None:
        """Send a recorded job's message. Refused by the broker, or never handed to it
        (unreachable), the job was not accepted: its record is undone (413, 503). Handed
        over but not acknowledged (a slow or frozen broker), it may still arrive: the job
        was accepted and stays recorded, for that message or the sweep's re-send (after
        ``requeue_after_seconds``) to start it; a worker runs it once either way."""
        try:
            await self.threads.store(self._queue.enqueue, message)
        except MessageTooLarge as exc:  # the broker's own limit is lower than the producer's
            await self._undo(job, digest)
            raise too_large_for_queue(exc) from exc
        except QueueUnavailable as exc:
            if exc.maybe_delivered:
                log.warning("job %s: the broker did not acknowledge its message: %s", job.id, exc)
                return
            await self._undo(job, digest)
            raise unavailable("queue", exc) from exc

    async def _created_by_another(self, job_id: str, headers: dict[str, str]) -> Response:
        existing = await self.storage(self._store.get, job_id)
        if existing is None:  # that create has just failed and undone its record
            raise OpenAIError(
                409,
                "Another request with this Idempotency-Key failed just now; retry.",
                param="Idempotency-Key",
                code="idempotency_conflict",
                headers={"retry-after": "1", **headers},
            )
        return json_response(await self._public(existing), headers=headers)

    async def _undo(self, job: Job, digest: Any) -> None:
        await self.threads.store(self._jobs.discard, job)
        if digest is not None:
            await self.threads.store(self._store.release_idempotency, job.owner, digest.hexdigest())

    # -- replay -----------------------------------------------------------------------------

    async def replay(self, request: Request, job_id: str) -> Response:
        """A new job of kind ``replay`` that runs ``job_id``'s recorded commands again
        without the model (see :mod:`tiergate.jobs.run.replay`): the gateway only checks and
        queues it, a worker runs it. Another key's job is a 404 as for get; a job not
        finished, or one that cannot be replayed, a 409; it counts against the key's rate
        limit and outstanding jobs as a submit does."""
        caller = self.caller(request)
        original = await self._owned(request, job_id)
        if not original.status.terminal:
            raise OpenAIError(
                409,
                f"Job {job_id} is {original.status.value}: only a finished job can be replayed.",
                param="job_id",
                code="job_not_finished",
            )
        if not original.status.replayable or original.kind == "replay":
            why = "it is itself a replay" if original.kind == "replay" else "it was cancelled"
            raise OpenAIError(
                409,
                f"Job {job_id} cannot be replayed: {why}.",
                param="job_id",
                code="job_not_replayable",
            )
        artifacts = await self.storage(self._store.artifact_urls, job_id)
        spec: JobCreate | None = await self.storage(self._store.spec, job_id)
        if "trajectory" not in artifacts or spec is None:
            raise OpenAIError(
                409,
                f"Job {job_id} cannot be replayed: it recorded no trajectory.",
                param="job_id",
                code="job_not_replayable",
            )
        if upload := spec.workspace.upload_id:
            await self._uploads.check_named(caller, upload, 409, "job_id")
        self._check_size(caller, spec)
        with self._reservations.ticket(caller.owner) as ticket:
            replay_id, headers = await self._admit(caller, ticket)
            job = self._jobs.new_job(replay_id, caller.owner, spec)
            job.kind, job.replay_of = "replay", job_id
            try:
                await self.threads.store(self._jobs.create, job, spec)
            except StorageError as exc:
                await self._undo(job, None)
                raise unavailable("store", exc) from exc
        message = JobMessage(id=job.id, owner=job.owner, spec=spec, replay_of=job_id)
        await self._enqueue(job, message, None)
        return json_response(job.public({}), headers=headers)

    # -- uploads ----------------------------------------------------------------------------

    @property
    def uploads(self) -> Uploads:
        return self._uploads

    async def upload(self, request: Request) -> Response:
        """A starting workspace (a tar archive, optionally compressed) for this key's jobs;
        received as :mod:`~tiergate.gateway.jobs.uploads` says."""
        answer, headers = await self._uploads.receive(self.caller(request), request)
        return json_response(answer, headers=headers)

    async def delete_upload(self, request: Request, upload_id: str) -> Response:
        return json_response(await self._uploads.delete(self.caller(request), upload_id))

    # -- read, list, cancel, events ---------------------------------------------------------

    async def get(self, request: Request, job_id: str) -> Response:
        return json_response(await self._public(await self._owned(request, job_id)))

    async def listing(self, request: Request, after: str | None, limit: int) -> Response:
        caller = self.caller(request)
        jobs, more = await self.read(caller, self._store.list_jobs, caller.owner, after, limit)
        data = [job.public({}) for job in jobs]
        return json_response(list_page(data, more))

    async def cancel(self, request: Request, job_id: str) -> Response:
        job = await self._owned(request, job_id)
        job = await self.storage(self._jobs.cancel, job)
        return json_response(await self._public(job))

    async def events(self, request: Request, job_id: str, starting_after: int) -> Response:
        caller = self.caller(request)
        await self._owned(request, job_id)
        return await self.streams.open(caller, job_id, starting_after)
