"""The jobs API: ``/v1/jobs`` over the Kafka pipeline and the object-storage job store.

It mirrors OpenAI's background responses: create answers at once with ``queued`` (but only
after the broker acknowledged the job), poll ``GET /v1/jobs/{id}``, cancel idempotently,
and stream events with ``sequence_number`` (resume with ``starting_after``). With API keys
on, a job exists only for the key that created it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import FastAPI, Request
from pydantic import ValidationError
from starlette.responses import Response, StreamingResponse

from tiergate.gateway import openapi
from tiergate.gateway.errors import OpenAIError
from tiergate.gateway.gatekeeper import Gatekeeper
from tiergate.gateway.selection import parse_body, read_body
from tiergate.queue.pipeline import JobQueue, QueueUnavailable
from tiergate.queue.schema import Job, JobCreate, JobMessage, JobStatus
from tiergate.queue.store import JobStore, StorageError
from tiergate.tiers import UnknownTierError, parse_requested_tier


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def _unavailable(what: str, exc: Exception) -> OpenAIError:
    return OpenAIError(
        503,
        f"The job {what} is unavailable ({exc}); nothing was accepted.",
        code=f"{what.replace(' ', '_')}_unavailable",
        headers={"retry-after": "5"},
    )


class JobsAPI:
    def __init__(
        self,
        store: JobStore,
        queue: JobQueue,
        gatekeeper: Gatekeeper,
        served_models: Any,
        max_body_bytes: int,
    ) -> None:
        self._max_body_bytes = max_body_bytes
        self._store = store
        self._queue = queue
        self._gatekeeper = gatekeeper
        self._served_models = served_models

    async def _owned(self, request: Request, job_id: str) -> tuple[Job, str]:
        caller = self._gatekeeper.authenticate(request.headers.get("authorization"))
        try:
            job = await asyncio.to_thread(self._store.get, job_id)
        except StorageError as exc:
            raise _unavailable("store", exc) from exc
        if job is None or job.owner != caller.name:
            # Another key's job does not exist, as far as this key can tell.
            raise OpenAIError(
                404, f"No job with id {job_id!r}.", param="job_id", code="job_not_found"
            )
        return job, caller.name

    async def _public(self, job: Job) -> dict[str, Any]:
        try:
            artifacts = await asyncio.to_thread(self._store.artifact_urls, job.id)
        except StorageError:
            artifacts = {}
        return job.public(artifacts)

    async def create(self, request: Request) -> Response:
        caller = self._gatekeeper.authenticate(request.headers.get("authorization"))
        body = parse_body(await read_body(request, self._max_body_bytes))
        try:
            spec = JobCreate.model_validate(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first["loc"]) or None
            raise OpenAIError(400, f"{param}: {first['msg']}", param=param) from None
        try:
            tier = parse_requested_tier(spec.service_tier)
        except UnknownTierError:
            raise OpenAIError(
                400,
                f"Unknown service tier {spec.service_tier!r}.",
                param="service_tier",
                code="invalid_service_tier",
            ) from None
        if spec.model not in self._served_models():
            raise OpenAIError(
                404,
                f"The model {spec.model!r} does not exist.",
                param="model",
                code="model_not_found",
            )
        if tier is not None:
            self._gatekeeper.authenticator.check_access(caller, spec.model, tier, True)
        elif not caller.may_use_model(spec.model):
            raise OpenAIError(
                403,
                f"This API key may not use the model {spec.model!r}.",
                param="model",
                code="model_not_allowed",
            )
        job = Job(
            id=f"job_{uuid.uuid4().hex}",
            owner=caller.name,
            status=JobStatus.QUEUED,
            model=spec.model,
            service_tier=spec.service_tier,
            created_at=int(time.time()),
            metadata=spec.metadata,
        )
        try:
            await asyncio.to_thread(self._store.create, job, spec)
            await asyncio.to_thread(
                self._store.append_event,
                job.id,
                1,
                {"type": "job.queued", "status": "queued", "created_at": job.created_at},
            )
        except StorageError as exc:
            await asyncio.to_thread(self._store.delete, job)
            raise _unavailable("store", exc) from exc
        try:
            await asyncio.to_thread(
                self._queue.enqueue, JobMessage(id=job.id, owner=job.owner, spec=spec)
            )
        except QueueUnavailable as exc:
            await asyncio.to_thread(self._store.delete, job)
            raise _unavailable("queue", exc) from exc
        return _json(job.public({}))

    async def get(self, request: Request, job_id: str) -> Response:
        job, _ = await self._owned(request, job_id)
        return _json(await self._public(job))

    async def list(self, request: Request, after: str | None, limit: int) -> Response:
        caller = self._gatekeeper.authenticate(request.headers.get("authorization"))
        try:
            jobs, more = await asyncio.to_thread(self._store.list_jobs, caller.name, after, limit)
        except StorageError as exc:
            raise _unavailable("store", exc) from exc
        data = [job.public({}) for job in jobs]
        return _json(
            {
                "object": "list",
                "data": data,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
                "has_more": more,
            }
        )

    async def cancel(self, request: Request, job_id: str) -> Response:
        job, _ = await self._owned(request, job_id)
        if job.status.terminal:
            return _json(await self._public(job))
        try:
            await asyncio.to_thread(self._store.request_cancel, job_id)
            if job.status is JobStatus.QUEUED:
                job.status = JobStatus.CANCELLED
                job.completed_at = int(time.time())
                if await asyncio.to_thread(self._store.finalize, job):
                    await asyncio.to_thread(self._cancelled_event, job)
                else:
                    current = await asyncio.to_thread(self._store.get, job_id)
                    job = current or job
            else:
                # A running job stops within seconds (the worker watches for this).
                job.cancel_requested_at = int(time.time())
                await asyncio.to_thread(self._store.put_status, job)
        except StorageError as exc:
            raise _unavailable("store", exc) from exc
        return _json(await self._public(job))

    def _cancelled_event(self, job: Job) -> None:
        sequence = self._store.last_sequence(job.id) + 1
        self._store.append_event(
            job.id,
            sequence,
            {
                "type": "job.cancelled",
                "status": "cancelled",
                "created_at": int(time.time()),
                "job": job.model_dump(mode="json", exclude={"owner"}),
            },
        )

    async def events(self, request: Request, job_id: str, starting_after: int) -> Response:
        await self._owned(request, job_id)

        async def stream() -> AsyncIterator[bytes]:
            after = starting_after
            idle = 0.0
            while True:
                try:
                    found = await asyncio.to_thread(self._store.events, job_id, after)
                except StorageError as exc:
                    err = OpenAIError(
                        503, f"The job store is unavailable ({exc}).", code="store_unavailable"
                    )
                    yield b"data: " + orjson.dumps(err.envelope()) + b"\n\n"
                    return
                for event in found:
                    after = event["sequence_number"]
                    yield b"data: " + orjson.dumps(event) + b"\n\n"
                    if event["type"] in _TERMINAL_EVENTS:
                        yield b"data: [DONE]\n\n"
                        return
                if found:
                    idle = 0.0
                elif idle >= 15.0:
                    idle = 0.0
                    yield b": keep-alive\n\n"
                    # A finished job whose terminal event never came (its worker died in
                    # between; the next delivery writes it) must not hold the stream open.
                    job = await asyncio.to_thread(self._store.final, job_id)
                    if job is not None:
                        yield b"data: [DONE]\n\n"
                        return
                await asyncio.sleep(0.5)
                idle += 0.5

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )


_TERMINAL_EVENTS = {f"job.{s.value}" for s in JobStatus if s.terminal}


def register_job_routes(app: FastAPI) -> None:
    """The ``/v1/jobs`` routes; they answer 404 ``jobs_disabled`` when jobs are off."""

    def api(request: Request) -> JobsAPI:
        jobs: JobsAPI | None = request.app.state.gateway.jobs
        if jobs is None:
            raise OpenAIError(
                404, "Jobs are not enabled on this gateway (jobs.enabled).", code="jobs_disabled"
            )
        return jobs

    errors = openapi.error_responses("400", "401", "403", "404", "503")

    @app.post(
        "/v1/jobs",
        tags=["jobs"],
        responses=errors,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": JobCreate.model_json_schema()}},
            }
        },
    )
    async def create_job(request: Request) -> Response:
        """Submit an agent job; answers once the broker has acknowledged it."""
        return await api(request).create(request)

    @app.get("/v1/jobs", tags=["jobs"], responses=errors)
    async def list_jobs(request: Request, after: str | None = None, limit: int = 20) -> Response:
        if not 1 <= limit <= 100:
            raise OpenAIError(400, "limit must be between 1 and 100.", param="limit")
        return await api(request).list(request, after, limit)

    @app.get("/v1/jobs/{job_id}", tags=["jobs"], responses=errors)
    async def get_job(request: Request, job_id: str) -> Response:
        return await api(request).get(request, job_id)

    @app.post("/v1/jobs/{job_id}/cancel", tags=["jobs"], responses=errors)
    async def cancel_job(request: Request, job_id: str) -> Response:
        """Idempotent; a cancelled job stays cancelled."""
        return await api(request).cancel(request, job_id)

    @app.get("/v1/jobs/{job_id}/events", tags=["jobs"], responses=errors)
    async def job_events(request: Request, job_id: str, starting_after: int = 0) -> Response:
        """Server-Sent Events of status changes and steps, each with a sequence_number."""
        return await api(request).events(request, job_id, starting_after)
