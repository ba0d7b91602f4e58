"""OpenAI's Files API (``/v1/files``) for the Batch API's input files, as OpenAI's clients
call it: ``client.files.create(file=..., purpose="batch")``, list, retrieve, content,
delete. A file exists only for the key that uploaded it (another key's is 404).

An upload is ``multipart/form-data`` with the fields ``file`` and ``purpose``. It is never
held in memory: the form parser spools the part to disk (over 1 MiB), the body is counted
as it arrives (413 past ``jobs.files.max_file_bytes``: OpenAI's 200 MB for a batch file),
the lines are checked while the part is copied to a file of its own (each a JSON object, at
most ``jobs.files.max_lines``: OpenAI's 50,000 requests; else 400 naming the line), and the
copy is sent to object storage in parts. A key holds at most ``jobs.files.max_files_per_key``
files and ``jobs.files.quota_bytes`` of them (429 ``file_quota_exceeded``). A refused
upload stores nothing. Only ``purpose: batch`` is accepted; the others (fine-tuning,
assistants) are OpenAI features this gateway does not have, and are a 400 that says so.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import orjson
from fastapi import Request
from starlette.datastructures import UploadFile
from starlette.responses import FileResponse, Response
from starlette.types import Message, Receive, Scope, Send

from tiergate.gateway.access.auth import Caller
from tiergate.gateway.access.gatekeeper import Gatekeeper
from tiergate.gateway.errors import OpenAIError
from tiergate.gateway.jobs.uploads import Reads, SpoolSlots, Storage
from tiergate.jobs.lines.reading import LineTooLong, bounded_lines, too_long_message
from tiergate.jobs.state.files import FileStore, new_file_id
from tiergate.jobsettings import JobsSettings
from tiergate.protocol.base import list_page

PURPOSES = ("batch",)
_FILE_ID = re.compile(r"file-[0-9a-f]{32}")
# Room for the form's boundaries, headers and the purpose field around the file's bytes.
_FORM_OVERHEAD = 64 * 1024
_LIST_MAX = 10_000  # OpenAI's most files a page


def _json(data: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(data), media_type="application/json", headers=headers)


def _not_found(file_id: str) -> OpenAIError:
    return OpenAIError(
        404, f"No such File object: {file_id}", param="file_id", code="file_not_found"
    )


def _too_large(limit: int) -> OpenAIError:
    return OpenAIError(
        413,
        f"The file exceeds {limit} bytes, this installation's limit "
        f"(jobs.files.max_file_bytes: {limit}; OpenAI's for a batch file is 200 MB).",
        code="file_too_large",
    )


def _counting(receive: Receive, limit: int) -> Receive:
    """``receive`` that raises 413 once the body has passed ``limit`` bytes."""
    seen = 0

    async def counted() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise _too_large(limit)
        return message

    return counted


def check_lines(
    source: IO[bytes], out: IO[bytes], max_lines: int, max_line_bytes: int
) -> tuple[int, int]:
    """Copy ``source`` to ``out`` while checking it is JSON lines, each an object of at
    most ``max_line_bytes``: the number of lines (blank ones are not counted) and of bytes.
    400 naming the first bad line."""
    try:
        return _check_lines(source, out, max_lines, max_line_bytes)
    except LineTooLong as exc:
        raise OpenAIError(400, too_long_message(exc), param="file", code="line_too_long") from None


def _check_lines(
    source: IO[bytes], out: IO[bytes], max_lines: int, max_line_bytes: int
) -> tuple[int, int]:
    count = size = 0
    for number, line in enumerate(bounded_lines(source, max_line_bytes), start=1):
        out.write(line)
        size += len(line)
        if not line.strip():
            continue
        count += 1
        if count > max_lines:
            raise OpenAIError(
                400,
                f"The file has more than {max_lines} requests (jobs.files.max_lines; "
                "OpenAI's limit for a batch file is 50,000).",
                param="file",
                code="too_many_lines",
            )
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise OpenAIError(
                400, f"Line {number} is not valid JSON: {exc}.", param="file", code="invalid_file"
            ) from None
        if not isinstance(value, dict):
            raise OpenAIError(
                400, f"Line {number} is not a JSON object.", param="file", code="invalid_file"
            )
    out.flush()
    return count, size


class _ServedCopy(FileResponse):
    """A file's temporary copy, served; ``done`` runs however the response ends: sent
    whole, or its client gone mid-body (where Starlette skips a background task)."""

    def __init__(self, path: Path, done: Callable[[], None]) -> None:
        super().__init__(path, media_type="application/octet-stream")
        self._done = done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._done()


class FilesAPI:
    """Receives, lists, serves and deletes each key's files."""

    def __init__(
        self,
        jobs: JobsSettings,
        files: FileStore,
        gatekeeper: Gatekeeper,
        storage: Storage,
        reads: Reads,
        slots: SpoolSlots,
        max_line_bytes: int,
        check: Storage,
        planner: Callable[[Path], dict[str, Any] | None] | None = None,
    ) -> None:
        """``check``: runs a file's check on the checks' own threads
        (tiergate.gateway.jobs.threads); ``planner``: a batch input's check, made once at
        upload and stored with it for the create (tiergate.gateway.jobs.openaibatch.api)."""
        self._jobs = jobs
        self._check = check
        self._planner = planner
        # gateway.max_body_bytes: a longer line could never be sent (tiergate.jobs.lines.reading).
        self._max_line_bytes = max_line_bytes
        self._settings = jobs.files
        self._files = files
        self._gatekeeper = gatekeeper
        self._storage = storage
        # A key's reads of its files (a file, its content, the list): charged to its read
        # budget, as its reads of jobs are (tiergate.gateway.access.readcost).
        self._reads = reads
        # Files this replica is receiving or serving count against the slots every spooled
        # transfer shares: an upload may spool twice max_file_bytes to the temporary
        # directory (the form's part and the copy), a download the file's size.
        self._slots = slots

    def _caller(self, request: Request) -> Caller:
        return self._gatekeeper.authenticate(request.headers.get("authorization"))

    async def create(self, request: Request) -> Response:
        caller = self._caller(request)
        s = self._settings
        limit = s.max_file_bytes + _FORM_OVERHEAD
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _too_large(s.max_file_bytes)
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            raise OpenAIError(
                400,
                "Send the file as multipart/form-data with the fields file and purpose.",
                code="invalid_request",
            )
        file_id = new_file_id()
        headers = await self._gatekeeper.count_request(caller, file_id)
        await self._check_quota(caller, 0, headers)
        self._slots.take(caller.owner, headers)
        try:
            return await self._receive(caller, request, limit, file_id, headers)
        finally:
            self._slots.release(caller.owner)

    async def _receive(
        self, caller: Caller, request: Request, limit: int, file_id: str, headers: dict[str, str]
    ) -> Response:
        s = self._settings
        counted = Request(request.scope, _counting(request.receive, limit))
        async with counted.form(max_files=1, max_fields=8) as form:
            purpose = form.get("purpose")
            upload = form.get("file")
            if not isinstance(purpose, str) or purpose not in PURPOSES:
                raise OpenAIError(
                    400,
                    f"purpose must be one of {', '.join(PURPOSES)}: this gateway keeps files "
                    "for the Batch API only.",
                    param="purpose",
                    code="unsupported_purpose",
                )
            if not isinstance(upload, UploadFile):
                raise OpenAIError(400, "The form has no file field.", param="file")
            with tempfile.NamedTemporaryFile(prefix="tiergate-file-") as copy:
                lines, size = await self._check(
                    check_lines, upload.file, copy, s.max_lines, self._max_line_bytes
                )
                if size > s.max_file_bytes:
                    raise _too_large(s.max_file_bytes)
                if lines == 0:
                    raise OpenAIError(
                        400,
                        "The file is empty: one request a line.",
                        param="file",
                        code="invalid_file",
                    )
                await self._check_quota(caller, size, headers)
                plan = None
                if purpose == "batch" and self._planner is not None:
                    plan = await self._check(self._planner, Path(copy.name))
                meta = {
                    "id": file_id,
                    "object": "file",
                    "bytes": size,
                    "created_at": int(time.time()),
                    "filename": upload.filename or "upload.jsonl",
                    "purpose": purpose,
                    "status": "processed",
                    "expires_at": None,
                    "status_details": None,
                }
                await self._storage(self._files.put, caller.owner, meta, Path(copy.name), plan)
        return _json(meta, headers)

    async def _check_quota(self, caller: Caller, adding: int, headers: dict[str, str]) -> None:
        count, size = await self._storage(self._files.usage, caller.owner)
        s = self._settings
        if count >= s.max_files_per_key:
            why = f"this key holds {count} files, its limit (jobs.files.max_files_per_key)"
        elif size + adding > s.quota_bytes:
            why = (
                f"this file would take this key's files to {size + adding} bytes, over its "
                f"quota (jobs.files.quota_bytes: {s.quota_bytes})"
            )
        else:
            return
        raise OpenAIError(
            429,
            f"The file cannot be stored: {why}. Delete files (DELETE /v1/files/{{id}}).",
            code="file_quota_exceeded",
            type_="rate_limit_error",
            headers={"retry-after": "60", **headers},
        )

    async def _meta(self, caller: Caller, file_id: str) -> dict[str, Any]:
        if not _FILE_ID.fullmatch(file_id):
            raise _not_found(file_id)
        meta: dict[str, Any] | None = await self._reads(
            caller, self._files.get, caller.owner, file_id
        )
        if meta is None:
            raise _not_found(file_id)
        return meta

    async def retrieve(self, request: Request, file_id: str) -> Response:
        return _json(await self._meta(self._caller(request), file_id))

    async def content(self, request: Request, file_id: str) -> Response:
        """The file's bytes, from a temporary copy streamed out and deleted after."""
        caller = self._caller(request)
        await self._meta(caller, file_id)
        # The copy lives until the client has read it: however slowly a key reads, it holds
        # at most its share of the slots (and of the temporary directory).
        self._slots.take(caller.owner, {}, doing="reading")
        try:
            path: Path | None = await self._reads(caller, self._fetch, caller.owner, file_id)
        except BaseException:
            self._slots.release(caller.owner)
            raise
        if path is None:
            self._slots.release(caller.owner)
            raise _not_found(file_id)

        def done() -> None:
            path.unlink(missing_ok=True)
            self._slots.release(caller.owner)

        return _ServedCopy(path, done)

    def _fetch(self, owner: str, file_id: str) -> Path | None:
        """The content in a temporary file of its own (None when it is missing)."""
        fd, name = tempfile.mkstemp(prefix="tiergate-file-")
        os.close(fd)
        path = Path(name)
        try:
            if self._files.content_to(owner, file_id, path):
                return path
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        path.unlink(missing_ok=True)
        return None

    async def delete(self, request: Request, file_id: str) -> Response:
        caller = self._caller(request)
        await self._meta(caller, file_id)
        await self._storage(self._files.delete, caller.owner, file_id)
        return _json({"id": file_id, "object": "file", "deleted": True})

    def _page(
        self, owner: str, purpose: str | None, limit: int, after: str | None, desc: bool
    ) -> tuple[list[dict[str, Any]], bool]:
        """A page of the owner's files (one metered read) and whether more follow."""
        ids = self._files.ids(owner)
        if desc:
            ids.reverse()
        if after is not None:  # ids sort by creation: this holds for a deleted one too
            ids = [i for i in ids if (i < after if desc else i > after)]
        data: list[dict[str, Any]] = []
        for file_id in ids:
            if len(data) == limit:
                return data, True
            meta = self._files.get(owner, file_id)
            if meta is not None and (purpose is None or meta.get("purpose") == purpose):
                data.append(meta)
        return data, False

    async def list(
        self, request: Request, purpose: str | None, limit: int, after: str | None, order: str
    ) -> Response:
        """OpenAI's page: newest first unless ``order`` is ``asc``; ``after`` an id."""
        caller = self._caller(request)
        if order not in ("asc", "desc"):
            raise OpenAIError(400, "order must be asc or desc.", param="order")
        if not 1 <= limit <= _LIST_MAX:
            raise OpenAIError(400, f"limit must be from 1 to {_LIST_MAX}.", param="limit")
        page = self._page, caller.owner, purpose, limit, after, order == "desc"
        data, more = await self._reads(caller, *page)
        return _json(list_page(data, more))
