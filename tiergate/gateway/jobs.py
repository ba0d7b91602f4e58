"""The jobs API: ``/v1/jobs`` over the Kafka pipeline and the object-storage job store.

It mirrors OpenAI's background responses: create answers at once with ``queued`` (but only
after the broker acknowledged the job), poll ``GET /v1/jobs/{id}``, cancel idempotently,
and stream events with ``sequence_number`` (resume with ``starting_after``). With API keys
on, a job (and an uploaded workspace) exists only for the key that created it. Every
state change goes through :class:`JobLifecycle`; every storage or broker failure is a 503
with ``retry-after`` that names no bucket, key or address.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import Request
from pydantic import ValidationError
from starlette.responses import Response, StreamingResponse

from tiergate.gateway.auth import Caller
from tiergate.gateway.errors import OpenAIError
from tiergate.gateway.gatekeeper import Gatekeeper
from tiergate.gateway.policy import AskedTier, Needs, Reason
from tiergate.gateway.selection import parse_body, read_body
from tiergate.queue.lifecycle import JobLifecycle
from tiergate.queue.pipeline import JobQueue, QueueUnavailable
from tiergate.queue.replay import REPLAYABLE
from tiergate.queue.schema import Job, JobCreate, JobMessage, JobStatus
from tiergate.queue.store import JobStore, StorageError
from tiergate.settings import JobsSettings
from tiergate.tiers import UnknownTierError, parse_requested_tier

TERMINAL_EVENTS = {f"job.{s.value}" for s in JobStatus if s.terminal}


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
        served_models: Any,
        max_body_bytes: int,
    ) -> None:
        self._settings = settings
        self._max_body_bytes = max_body_bytes
        self._store = store
        self._queue = queue
        self._jobs = JobLifecycle(store)
        self._gatekeeper = gatekeeper
        self._served_models = served_models

    async def _storage(self, fn: Any, *args: Any) -> Any:
        try:
            return await asyncio.to_thread(fn, *args)
        except StorageError as exc:
            raise unavailable("store", exc) from exc

    def _caller(self, request: Request) -> Caller:
        return self._gatekeeper.authenticate(request.headers.get("authorization"))

    async def _owned(self, request: Request, job_id: str) -> Job:
        caller = self._caller(request)
        job: Job | None = await self._storage(self._store.get, job_id)
        if job is None or job.owner != caller.name:
            # Another key's job does not exist, as far as this key can tell.
            raise OpenAIError(
                404, f"No job with id {job_id!r}.", param="job_id", code="job_not_found"
            )
        return job

    async def _public(self, job: Job) -> dict[str, Any]:
        try:
            artifacts = await asyncio.to_thread(self._store.artifact_urls, job.id)
        except StorageError:
            artifacts = {}
        return job.public(artifacts)

    # -- create -----------------------------------------------------------------------------

    def _check_spec(self, caller: Caller, spec: JobCreate) -> None:
        try:
            tier = parse_requested_tier(spec.service_tier)
        except UnknownTierError:
            raise OpenAIError(
                400,
                f"Unknown service tier {spec.service_tier!r}.",
                param="service_tier",
                code="invalid_service_tier",
            ) from None
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
        if not caller.may_use_model(spec.model):
            raise OpenAIError(
                403,
                "This API key may not use the requested model.",
                param="model",
                code="model_not_allowed",
            )
        if spec.model not in self._served_models():
            raise OpenAIError(
                404,
                f"The model {spec.model!r} does not exist.",
                param="model",
                code="model_not_found",
            )
        # The job's model calls are decided per call by the tier policy, as any request's;
        # an explicitly asked tier the key may not use is refused now rather than later.
        if tier is not None:
            self._gatekeeper.policy.decide(
                caller, AskedTier(tier, Reason.REQUESTED), Needs("/v1/chat/completions")
            )

    async def _admit(self, caller: Caller) -> tuple[str, dict[str, str]]:
        """A new job's id and rate-limit headers, once the submission is counted against
        the key's requests per minute (429 when over) and its outstanding jobs are under
        the cap (429 when at it): what create and replay both check."""
        job_id = f"job_{uuid.uuid4().hex}"
        headers = await self._gatekeeper.count_request(caller, job_id)
        cap = (caller.key and caller.key.limits.max_outstanding_jobs) or (
            self._settings.max_outstanding_jobs
        )
        if await self._storage(self._store.outstanding, caller.name, cap) >= cap:
            raise OpenAIError(
                429,
                f"This key has {cap} unfinished jobs, its limit; wait for one to finish.",
                code="too_many_outstanding_jobs",
                type_="rate_limit_error",
                headers={"retry-after": "30", **headers},
            )
        return job_id, headers

    async def create(self, request: Request) -> Response:
        caller = self._caller(request)
        body = parse_body(await read_body(request, self._max_body_bytes))
        try:
            spec = JobCreate.model_validate(body)
        except ValidationError as exc:
            raise _invalid(exc) from None
        self._check_spec(caller, spec)
        upload = spec.workspace.upload_id
        if upload and not await self._storage(self._store.has_upload, caller.name, upload):
            raise OpenAIError(
                400,
                f"No workspace upload {upload!r} for this key (POST /v1/jobs/workspaces).",
                param="workspace.upload_id",
                code="upload_not_found",
            )
        job_id, headers = await self._admit(caller)
        digest = None
        if idempotency := request.headers.get("idempotency-key"):
            digest = hashlib.sha256(f"{idempotency}\n{spec.model_dump_json()}".encode())
            digest_hex = digest.hexdigest()
            bound = await self._storage(
                self._store.claim_idempotency, caller.name, digest_hex, job_id
            )
            if bound != job_id:
                existing = await self._storage(self._store.get, bound)
                if existing is not None:
                    return json_response(await self._public(existing), headers=headers)
                job_id = bound  # a retry of a create that failed before its record
        job = self._jobs.new_job(job_id, caller.name, spec)
        try:
            await asyncio.to_thread(self._jobs.create, job, spec)
        except StorageError as exc:
            await self._undo(job, digest)
            raise unavailable("store", exc) from exc
        try:
            await asyncio.to_thread(
                self._queue.enqueue, JobMessage(id=job.id, owner=job.owner, spec=spec)
            )
        except QueueUnavailable as exc:
            await self._undo(job, digest)
            raise unavailable("queue", exc) from exc
        return json_response(job.public({}), headers=headers)

    async def _undo(self, job: Job, digest: Any) -> None:
        await asyncio.to_thread(self._jobs.discard, job)
        if digest is not None:
            await asyncio.to_thread(self._store.release_idempotency, job.owner, digest.hexdigest())

    # -- replay -----------------------------------------------------------------------------

    async def replay(self, request: Request, job_id: str) -> Response:
        """A new job of kind ``replay`` that runs ``job_id``'s recorded commands again
        without the model (see :mod:`tiergate.queue.replay`): the gateway only checks and
        queues it, a worker runs it. Another key's job is a 404 as for get; a job not
        finished, or one that cannot be replayed, a 409; it counts against the key's rate
        limit and outstanding jobs as a submit does."""
        caller = self._caller(request)
        original = await self._owned(request, job_id)
        if not original.status.terminal:
            raise OpenAIError(
                409,
                f"Job {job_id} is {original.status.value}: only a finished job can be replayed.",
                param="job_id",
                code="job_not_finished",
            )
        if original.status not in REPLAYABLE or original.kind == "replay":
            why = "it is itself a replay" if original.kind == "replay" else "it was cancelled"
            raise OpenAIError(
                409,
                f"Job {job_id} cannot be replayed: {why}.",
                param="job_id",
                code="job_not_replayable",
            )
        artifacts = await self._storage(self._store.artifact_urls, job_id)
        spec: JobCreate | None = await self._storage(self._store.spec, job_id)
        if "trajectory" not in artifacts or spec is None:
            raise OpenAIError(
                409,
                f"Job {job_id} cannot be replayed: it recorded no trajectory.",
                param="job_id",
                code="job_not_replayable",
            )
        upload = spec.workspace.upload_id
        if upload and not await self._storage(self._store.has_upload, caller.name, upload):
            raise OpenAIError(
                409,
                f"Job {job_id} cannot be replayed: its workspace upload {upload!r} no longer "
                "exists.",
                param="job_id",
                code="upload_not_found",
            )
        replay_id, headers = await self._admit(caller)
        job = self._jobs.new_job(replay_id, caller.name, spec)
        job.kind, job.replay_of = "replay", job_id
        try:
            await asyncio.to_thread(self._jobs.create, job, spec)
        except StorageError as exc:
            await self._undo(job, None)
            raise unavailable("store", exc) from exc
        message = JobMessage(id=job.id, owner=job.owner, spec=spec, replay_of=job_id)
        try:
            await asyncio.to_thread(self._queue.enqueue, message)
        except QueueUnavailable as exc:
            await self._undo(job, None)
            raise unavailable("queue", exc) from exc
        return json_response(job.public({}), headers=headers)

    # -- uploads ----------------------------------------------------------------------------

    async def upload(self, request: Request) -> Response:
        """A starting workspace (a tar archive, optionally gzip'd) for this key's jobs."""
        caller = self._caller(request)
        body = await read_body(request, self._settings.max_upload_bytes)
        if not body:
            raise OpenAIError(400, "The upload is empty: send a tar archive as the body.")
        upload_id = f"upl_{uuid.uuid4().hex}"
        await self._storage(self._store.put_upload, caller.name, upload_id, body)
        return json_response({"id": upload_id, "object": "workspace.upload", "bytes": len(body)})

    # -- read, list, cancel, events ---------------------------------------------------------

    async def get(self, request: Request, job_id: str) -> Response:
        return json_response(await self._public(await self._owned(request, job_id)))

    async def listing(self, request: Request, after: str | None, limit: int) -> Response:
        caller = self._caller(request)
        jobs, more = await self._storage(self._store.list_jobs, caller.name, after, limit)
        data = [job.public({}) for job in jobs]
        return json_response(
            {
                "object": "list",
                "data": data,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
                "has_more": more,
            }
        )

    async def cancel(self, request: Request, job_id: str) -> Response:
        job = await self._owned(request, job_id)
        job = await self._storage(self._jobs.cancel, job)
        return json_response(await self._public(job))

    async def events(self, request: Request, job_id: str, starting_after: int) -> Response:
        await self._owned(request, job_id)
        # The first read happens before the response starts, so a store that is down is a
        # 503 like every other route, not a 200 stream that breaks at once.
        first = await self._storage(self._store.events, job_id, starting_after)
        return StreamingResponse(
            self._stream(job_id, starting_after, first),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )

    async def _stream(
        self, job_id: str, after: int, found: list[dict[str, Any]]
    ) -> AsyncIterator[bytes]:
        idle = 0.0
        while True:
            for event in found:
                after = event["sequence_number"]
                yield b"data: " + orjson.dumps(event) + b"\n\n"
                if event["type"] in TERMINAL_EVENTS:
                    yield b"data: [DONE]\n\n"
                    return
            if found:
                idle = 0.0
            elif idle >= 15.0:
                idle = 0.0
                yield b": keep-alive\n\n"
                # A finished job whose terminal event never came (its worker died in
                # between; the next delivery writes it) must not hold the stream open.
                try:
                    if await asyncio.to_thread(self._store.final, job_id) is not None:
                        yield b"data: [DONE]\n\n"
                        return
                except StorageError:
                    pass
            await asyncio.sleep(0.5)
            idle += 0.5
            try:
                found = await asyncio.to_thread(self._store.events, job_id, after)
            except StorageError as exc:
                # Mid-stream the status line is gone: say so in the stream, and the client
                # resumes with starting_after.
                err = unavailable("store", exc)
                yield b"data: " + orjson.dumps(err.envelope()) + b"\n\n"
                return
