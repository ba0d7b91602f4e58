"""OpenAI's ``/v1/batches`` routes (tiergate.gateway.jobs.openaibatch.api); 404 ``jobs_disabled``
when jobs are off: batches run on the jobs pipeline."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import FastAPI, Query, Request
from starlette.responses import Response

from tiergate.gateway import openapi
from tiergate.gateway.jobs.enabled import enabled
from tiergate.protocol.openaibatch import OpenAIBatchCreate

if TYPE_CHECKING:  # built only with jobs on (tiergate.gateway.jobs.wiring)
    from tiergate.gateway.jobs.openaibatch.api import BatchAPI

_CREATE: dict[str, Any] = OpenAIBatchCreate.model_json_schema(
    ref_template="#/components/schemas/{model}"
)
_CREATE_DEFS: dict[str, Any] = _CREATE.pop("$defs", {})


def add_batch_components(schema: dict[str, Any]) -> None:
    schema.setdefault("components", {}).setdefault("schemas", {}).update(_CREATE_DEFS)


def register_batch_routes(app: FastAPI, batches_of: Callable[[Request], BatchAPI | None]) -> None:
    def api(request: Request) -> BatchAPI:
        return enabled(batches_of(request), "Batches run on the jobs pipeline. ")

    errors = openapi.error_responses("400", "401", "404", "429", "503")

    @app.post(
        "/v1/batches",
        tags=["batches"],
        responses=errors,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _CREATE}},
            }
        },
    )
    async def create_batch(request: Request) -> Response:
        """A batch of model calls from an uploaded file (OpenAI's Batch API)."""
        return await api(request).create(request)

    @app.get("/v1/batches", tags=["batches"], responses=errors)
    async def list_batches(
        request: Request,
        after: str | None = None,
        limit: Annotated[int, Query(ge=1, le=100)] = 20,
    ) -> Response:
        return await api(request).list(request, after, limit)

    @app.get("/v1/batches/{batch_id}", tags=["batches"], responses=errors)
    async def retrieve_batch(request: Request, batch_id: str) -> Response:
        return await api(request).retrieve(request, batch_id)

    @app.post(
        "/v1/batches/{batch_id}/cancel",
        tags=["batches"],
        responses={**errors, "409": openapi.error_response("The batch is changing (conflict)")},
    )
    async def cancel_batch(request: Request, batch_id: str) -> Response:
        """Idempotent: ``cancelling``, then ``cancelled`` with what finished."""
        return await api(request).cancel(request, batch_id)
