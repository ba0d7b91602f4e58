"""OpenAI's ``/v1/files`` routes (tiergate.gateway.jobs.files); 404 ``jobs_disabled`` when
jobs are off: the files live in the jobs' object storage."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

from fastapi import FastAPI, Query, Request
from starlette.responses import Response

from tiergate.gateway import openapi
from tiergate.gateway.jobs.enabled import enabled

if TYPE_CHECKING:  # built only with jobs on (tiergate.gateway.jobs.wiring)
    from tiergate.gateway.jobs.files import FilesAPI

_UPLOAD_FORM = {
    "required": True,
    "content": {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "required": ["file", "purpose"],
                "properties": {
                    "file": {"type": "string", "format": "binary"},
                    "purpose": {"type": "string", "enum": ["batch"]},
                },
            }
        }
    },
}


def register_file_routes(app: FastAPI, files_of: Callable[[Request], FilesAPI | None]) -> None:
    """The routes, reaching the app's files through ``files_of`` (the app's state)."""

    def api(request: Request) -> FilesAPI:
        return enabled(files_of(request), "Files are kept in the jobs' object storage. ")

    errors = openapi.error_responses("400", "401", "404", "429", "503")

    @app.post(
        "/v1/files",
        tags=["files"],
        responses={**errors, "413": openapi.error_response("Over jobs.files.max_file_bytes")},
        openapi_extra={"requestBody": _UPLOAD_FORM},
    )
    async def create_file(request: Request) -> Response:
        """Upload a batch input file (JSON lines, one request a line), as OpenAI's
        ``client.files.create(file=..., purpose="batch")``."""
        return await api(request).create(request)

    @app.get("/v1/files", tags=["files"], responses=errors)
    async def list_files(
        request: Request,
        purpose: str | None = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
        after: str | None = None,
        order: Annotated[str, Query(pattern="^(asc|desc)$")] = "desc",
    ) -> Response:
        return await api(request).list(request, purpose, limit, after, order)

    @app.get("/v1/files/{file_id}", tags=["files"], responses=errors)
    async def retrieve_file(request: Request, file_id: str) -> Response:
        return await api(request).retrieve(request, file_id)

    @app.get("/v1/files/{file_id}/content", tags=["files"], responses=errors)
    async def file_content(request: Request, file_id: str) -> Response:
        """The file's bytes, streamed."""
        return await api(request).content(request, file_id)

    @app.delete("/v1/files/{file_id}", tags=["files"], responses=errors)
    async def delete_file(request: Request, file_id: str) -> Response:
        return await api(request).delete(request, file_id)
