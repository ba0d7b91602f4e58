"""The ``/v1/jobs`` routes; they answer 404 ``jobs_disabled`` when jobs are off."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import FastAPI, Query, Request
from starlette.responses import Response

from tiergate.gateway import openapi
from tiergate.gateway.jobs.enabled import enabled
from tiergate.protocol import JobCreate
from tiergate.protocol.batches import BatchCreate, PolicyVersion

if TYPE_CHECKING:  # built only with jobs on (tiergate.gateway.jobs.wiring)
    from tiergate.gateway.jobs.api import JobsAPI
    from tiergate.gateway.jobs.batches import BatchesAPI

# The job's schema with its nested models under the description's components/schemas.
_JOB_CREATE = JobCreate.model_json_schema(ref_template="#/components/schemas/{model}")
_JOB_DEFS: dict[str, Any] = _JOB_CREATE.pop("$defs", {})
_BATCH_CREATE = BatchCreate.model_json_schema(ref_template="#/components/schemas/{model}")
_JOB_DEFS.update(_BATCH_CREATE.pop("$defs", {}))


def add_job_components(schema: dict[str, Any]) -> None:
    """Install the job schema's nested models in the description's components."""
    schema.setdefault("components", {}).setdefault("schemas", {}).update(_JOB_DEFS)


def register_job_routes(
    app: FastAPI,
    jobs_of: Callable[[Request], JobsAPI | None],
    batches_of: Callable[[Request], BatchesAPI | None],
) -> None:
    """The routes, reaching the app's jobs and batches through ``jobs_of`` and
    ``batches_of`` (the app's state, which these routes stand below)."""

    def api(request: Request) -> JobsAPI:
        return enabled(jobs_of(request))

    def batches(request: Request) -> BatchesAPI:
        return enabled(batches_of(request))

    errors = openapi.error_responses("400", "401", "403", "404", "429", "503")

    @app.post(
        "/v1/jobs/batches",
        tags=["jobs"],
        responses=errors,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _BATCH_CREATE}},
            }
        },
    )
    async def create_batch(request: Request) -> Response:
        """A rollout batch: tasks across domains, several samples each, run as the key's
        own jobs and scheduled by the workers (docs/batches.md)."""
        return await batches(request).create(request)

    @app.post(
        "/v1/jobs/batches/tasks",
        tags=["jobs"],
        responses={**errors, "413": openapi.error_response("Over jobs.max_batch_tasks_bytes")},
        openapi_extra={
            "requestBody": {
                "required": True,
                # JSON lines: one task (BatchTask) a line.
                "content": {
                    "application/jsonl": {
                        "schema": {
                            "type": "array",
                            "items": {"$ref": "#/components/schemas/BatchTask"},
                        }
                    }
                },
            }
        },
    )
    async def upload_batch_tasks(request: Request) -> Response:
        """A batch's tasks as JSON lines (one task a line), checked line by line and kept
        as one of the key's uploads; name it as ``tasks_upload_id`` in a batch."""
        return await batches(request).upload_tasks(request)

    @app.get("/v1/jobs/batches/{batch_id}", tags=["jobs"], responses=errors)
    async def get_batch(request: Request, batch_id: str) -> Response:
        """Status, per-domain and per-task counts, pass rates, reward mean and spread,
        skips, and every rollout."""
        return await batches(request).get(request, batch_id)

    @app.post("/v1/jobs/batches/{batch_id}/cancel", tags=["jobs"], responses=errors)
    async def cancel_batch(request: Request, batch_id: str) -> Response:
        """Idempotent: nothing more starts, queued jobs are cancelled."""
        return await batches(request).cancel(request, batch_id)

    @app.get("/v1/jobs/batches/{batch_id}/events", tags=["jobs"], responses=errors)
    async def batch_events(request: Request, batch_id: str) -> Response:
        """Server-Sent Events: ``batch.rollout`` as each rollout finishes (every one
        finished so far on connecting), then ``batch.<status>`` and ``[DONE]``; counted
        against ``jobs.max_streams_per_key`` like a job's stream."""
        return await batches(request).events(request, batch_id)

    @app.post(
        "/v1/jobs/batches/{batch_id}/policy_version",
        tags=["jobs"],
        responses=errors,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": PolicyVersion.model_json_schema()}},
            }
        },
    )
    async def announce_policy_version(request: Request, batch_id: str) -> Response:
        """A trainer says which policy version the model serves now (``{"version": N}``,
        never lower than before): rollouts started after it record it, and with the
        batch's ``max_staleness`` samples more versions behind run again."""
        return await batches(request).announce_policy_version(request, batch_id)

    @app.get("/v1/jobs/batches/{batch_id}/groups", tags=["jobs"], responses=errors)
    async def batch_groups(
        request: Request,
        batch_id: str,
        starting_after: Annotated[int, Query(ge=0)] = 0,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> Response:
        """The batch's complete groups (one task's samples of one round) after
        ``starting_after`` (a group's ``seq``), at most ``limit``, as JSON lines, each
        with its samples' records and their rewards normalized within the group. The
        headers say the batch's status and how many groups it has so far."""
        return await batches(request).groups(request, batch_id, starting_after, limit)

    @app.get("/v1/jobs/batches/{batch_id}/groups/events", tags=["jobs"], responses=errors)
    async def batch_group_events(
        request: Request, batch_id: str, starting_after: Annotated[int, Query(ge=0)] = 0
    ) -> Response:
        """Server-Sent Events: ``batch.group`` as each group completes (every one after
        ``starting_after`` on connecting; each event's ``id`` is its ``seq``, and a
        ``Last-Event-ID`` header resumes after it), then ``batch.<status>`` and
        ``[DONE]``; counted against ``jobs.max_streams_per_key``."""
        last = request.headers.get("last-event-id", "")
        after = max(starting_after, int(last) if last.isdigit() else 0)
        return await batches(request).group_events(request, batch_id, after)

    @app.get("/v1/jobs/batches/{batch_id}/rollouts", tags=["jobs"], responses=errors)
    async def batch_rollouts(request: Request, batch_id: str) -> Response:
        """The finished rollouts as JSON lines, in TRL's conversational shapes."""
        return await batches(request).rollouts(request, batch_id)

    too_large: dict[int | str, dict[str, Any]] = {
        "413": openapi.error_response(
            "The body is over gateway.max_body_bytes, or the job's queue "
            "message over jobs.kafka.max_request_size (request_too_large)"
        )
    }

    @app.post(
        "/v1/jobs",
        tags=["jobs"],
        responses={**errors, **too_large},
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _JOB_CREATE}},
            },
            "parameters": [
                {
                    "name": "Idempotency-Key",
                    "in": "header",
                    "required": False,
                    "schema": {"type": "string", "maxLength": 255},
                    "description": "A retry with the same key and body returns the same job.",
                }
            ],
        },
    )
    async def create_job(request: Request) -> Response:
        """Submit an agent job; answers once the broker has acknowledged it."""
        return await api(request).create(request)

    @app.post(
        "/v1/jobs/workspaces",
        tags=["jobs"],
        responses={
            **errors,
            "400": openapi.error_response(
                "Empty, not a tar archive (invalid_upload), more members than "
                "jobs.max_upload_members (upload_too_many_members), or unpacking to more "
                "than jobs.max_upload_unpacked_bytes (upload_too_large_unpacked)"
            ),
            "413": openapi.error_response("Over jobs.max_upload_bytes (request_too_large)"),
            "429": openapi.error_response(
                "The key's requests per minute (rate_limit_exceeded), or its "
                "live uploads over jobs.max_uploads_per_key or jobs.upload_quota_bytes "
                "(upload_quota_exceeded)"
            ),
        },
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
                },
            }
        },
    )
    async def upload_workspace(request: Request) -> Response:
        """Upload a starting workspace (tar, optionally gzip'd); use its id as
        ``workspace.upload_id``. Only this key's jobs can use it, until ``expires_at``
        (``jobs.upload_ttl_seconds``); it counts against the key's upload quota until then."""
        return await api(request).upload(request)

    @app.delete(
        "/v1/jobs/workspaces/{upload_id}",
        tags=["jobs"],
        responses=openapi.error_responses("401", "404", "503"),
    )
    async def delete_workspace(request: Request, upload_id: str) -> Response:
        """Delete one of this key's uploads, freeing its quota."""
        return await api(request).delete_upload(request, upload_id)

    @app.get("/v1/jobs", tags=["jobs"], responses=errors)
    async def list_jobs(
        request: Request,
        after: str | None = None,
        limit: Annotated[int, Query(ge=1, le=100)] = 20,
    ) -> Response:
        return await api(request).listing(request, after, limit)

    @app.get("/v1/jobs/{job_id}", tags=["jobs"], responses=errors)
    async def get_job(request: Request, job_id: str) -> Response:
        return await api(request).get(request, job_id)

    @app.post("/v1/jobs/{job_id}/cancel", tags=["jobs"], responses=errors)
    async def cancel_job(request: Request, job_id: str) -> Response:
        """Idempotent; a cancelled job stays cancelled."""
        return await api(request).cancel(request, job_id)

    @app.post(
        "/v1/jobs/{job_id}/replay",
        tags=["jobs"],
        responses={
            **openapi.error_responses("401", "404", "429", "503"),
            "409": openapi.error_response(
                "The job is not finished (job_not_finished), or cannot be "
                "replayed (job_not_replayable, upload_not_found)"
            ),
        },
    )
    async def replay_job(request: Request, job_id: str) -> Response:
        """Replay a finished job: a new job of kind ``replay`` that a worker runs, the
        original's recorded commands without the model, answering with ``replay``: per
        step whether the exit status and the output match the original's trajectory."""
        return await api(request).replay(request, job_id)

    @app.get(
        "/v1/jobs/{job_id}/events",
        tags=["jobs"],
        responses={
            **errors,
            "429": openapi.error_response(
                "The key already has jobs.max_streams_per_key event streams "
                "open on this replica (rate_limit_exceeded)"
            ),
        },
    )
    async def job_events(
        request: Request, job_id: str, starting_after: Annotated[int, Query(ge=0)] = 0
    ) -> Response:
        """Server-Sent Events of status changes and steps, each with a sequence_number; at
        most ``jobs.max_streams_per_key`` open at once per key."""
        return await api(request).events(request, job_id, starting_after)
