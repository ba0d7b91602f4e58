"""OpenAI's Batch API (``/v1/batches``) over the jobs pipeline (tiergate.jobs.lines), as
OpenAI's clients call it: create from an uploaded file, retrieve, list, cancel.

Creating a batch validates its input file at once (a line that is not JSON, a duplicate
``custom_id``, a method other than POST, a ``url`` other than the batch's ``endpoint``, a
model the key may not use or that differs from the first line's) and a batch that fails
validation is answered ``failed`` with ``errors.data`` naming each line, as OpenAI reports
it; so ``validating`` is never seen here. A valid batch is cut into chunks of
``batch_api.chunk_lines``, each a record on the batch topic (acknowledged before the answer,
else 503 and nothing is kept), and is ``in_progress`` from then on. A key holds at most
``batch_api.max_active_batches`` unfinished batches (429), and their lines and estimated
tokens at most ``max_enqueued_requests`` and ``max_enqueued_tokens`` (the batch fails with
``request_limit_exceeded`` or ``token_limit_exceeded``, as OpenAI's does past its
enqueued-token limit). Another key's batch is 404.
"""

from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from fastapi import Request
from pydantic import ValidationError
from starlette.responses import Response

from tiergate.gateway.access.auth import Caller
from tiergate.gateway.access.gatekeeper import Gatekeeper
from tiergate.gateway.errors import OpenAIError
from tiergate.gateway.jobs.openaibatch.inputfile import Checked, LineRules, check_input, from_plan
from tiergate.gateway.jobs.reserve import Reservations, Ticket
from tiergate.gateway.jobs.uploads import Reads, SpoolSlots, Storage
from tiergate.gateway.openai.selection import parse_body, read_body
from tiergate.jobs.lines.finalize import Finalizer, public
from tiergate.jobs.lines.store import LineBatchStore, chunk_message, new_batch_id
from tiergate.jobs.state.files import FileStore
from tiergate.jobsettings import BatchApiSettings
from tiergate.protocol.base import list_page
from tiergate.protocol.openaibatch import FINAL, OpenAIBatchCreate
from tiergate.queue.pipeline import JobQueue, QueueUnavailable

_BATCH_ID = re.compile(r"batch_[0-9a-f]{32}")


def _json(data: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(data), media_type="application/json", headers=headers)


def _not_found(batch_id: str) -> OpenAIError:
    return OpenAIError(
        404, f"No such Batch object: {batch_id}", param="batch_id", code="batch_not_found"
    )


class BatchAPI:
    """The routes' work, for one gateway."""

    def __init__(
        self,
        settings: BatchApiSettings,
        lines: LineBatchStore,
        files: FileStore,
        queue: JobQueue,
        gatekeeper: Gatekeeper,
        storage: Storage,
        reads: Reads,
        max_body_bytes: int,
        chars_per_token: float,
        max_output: int,
        slots: SpoolSlots,
        check: Storage,
    ) -> None:
        """``check``: runs the input's check on the checks' own threads
        (tiergate.gateway.jobs.threads)."""
        self._settings = settings
        self._check_on = check
        self._lines = lines
        self._files = files
        self._queue = queue
        self._gatekeeper = gatekeeper
        self._storage = storage
        # A key's reads of its batches (one, the list): charged to its read budget, as its
        # reads of jobs are (tiergate.gateway.access.readcost).
        self._reads = reads
        self._max_body = max_body_bytes
        self._chars = chars_per_token
        self._max_output = max_output
        # The create's check spools the input file to the temporary directory: it holds
        # one of the slots every spooled transfer shares (SpoolSlots), as a download does.
        self._slots = slots
        # Finalization writes whole output files there too: under one of those slots.
        self._finalizer = Finalizer(lines, files, settings, room=slots.room)
        # This replica's creates under way, per key: the caps hold under parallel creates.
        self._reservations = Reservations()

    def _caller(self, request: Request) -> Caller:
        return self._gatekeeper.authenticate(request.headers.get("authorization"))

    async def create(self, request: Request) -> Response:
        caller = self._caller(request)
        try:
            spec = OpenAIBatchCreate.model_validate(
                parse_body(await read_body(request, self._max_body))
            )
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first["loc"]) or None
            raise OpenAIError(400, f"{param}: {first['msg']}", param=param) from None
        with self._reservations.ticket(caller.owner) as ticket:
            return await self._create(caller, spec, ticket)

    async def _create(self, caller: Caller, spec: OpenAIBatchCreate, ticket: Ticket) -> Response:
        batch_id = new_batch_id()
        headers = await self._gatekeeper.count_request(caller, batch_id)
        active, enqueued_lines, enqueued_tokens = await self._storage(
            self._lines.enqueued, caller.owner
        )
        active += ticket.ahead()  # this key's creates under way before this one
        s = self._settings
        # The owner's batches past their retention go now, at its own create's cost.
        await self._storage(
            self._lines.prune, caller.owner, time.time() - s.retention_seconds, s.prune_per_create
        )
        if active >= s.max_active_batches:
            raise OpenAIError(
                429,
                f"This key has {active} unfinished batches, its limit "
                f"(jobs.batch_api.max_active_batches); wait for one to end, or cancel one.",
                code="too_many_batches",
                type_="rate_limit_error",
                headers={"retry-after": "60", **headers},
            )
        meta = await self._storage(self._files.get, caller.owner, spec.input_file_id)
        if meta is None or meta.get("purpose") != "batch":
            raise OpenAIError(
                400,
                f"No batch input file {spec.input_file_id!r} for this key (POST /v1/files "
                "with purpose batch).",
                param="input_file_id",
                code="file_not_found",
            )
        checked = await self._check(caller, spec, headers)
        now = int(time.time())
        batch: dict[str, Any] = {
            "id": batch_id,
            "object": "batch",
            "endpoint": spec.endpoint,
            "model": checked.model,
            "errors": None,
            "input_file_id": spec.input_file_id,
            "completion_window": spec.completion_window,
            "status": "in_progress",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": now,
            "in_progress_at": now,
            "expires_at": now + s.completion_window_seconds,
            "finalizing_at": None,
            "completed_at": None,
            "failed_at": None,
            "expired_at": None,
            "cancelling_at": None,
            "cancelled_at": None,
            "request_counts": {"total": checked.lines, "completed": 0, "failed": 0},
            "metadata": spec.metadata,
            "_chunks": len(checked.plan),
        }
        if not checked.errors:
            # The claim stands until the ticket is returned, after the batch's record (whose
            # marker enqueued() counts) is written: a parallel create of this key that
            # claims later counts it either way (reserve.py).
            claimed_lines, claimed_tokens = ticket.claim(checked.lines, checked.tokens)
            enqueued_lines += claimed_lines
            enqueued_tokens += claimed_tokens
            if enqueued_lines + checked.lines > s.max_enqueued_requests:
                checked.error(
                    "request_limit_exceeded",
                    f"This key's unfinished batches would hold {enqueued_lines + checked.lines} "
                    f"requests, over its limit (jobs.batch_api.max_enqueued_requests: "
                    f"{s.max_enqueued_requests}).",
                    0,
                )
            elif enqueued_tokens + checked.tokens > s.max_enqueued_tokens:
                checked.error(
                    "token_limit_exceeded",
                    f"Enqueued token limit reached: this key's unfinished batches would hold "
                    f"about {enqueued_tokens + checked.tokens} tokens, over its limit "
                    f"(jobs.batch_api.max_enqueued_tokens: {s.max_enqueued_tokens}).",
                    0,
                )
        if checked.errors:
            failed = await self._storage(self._lines.failed_since, caller.owner, now - 86400)
            if failed >= s.max_failed_batches_per_day:
                raise OpenAIError(
                    429,
                    f"This key made {failed} batches whose input failed its checks in the last "
                    f"24 hours, its limit (jobs.batch_api.max_failed_batches_per_day); fix the "
                    f"input file and retry later. This one failed with: "
                    f"{checked.errors[0]['message']}",
                    code="too_many_failed_batches",
                    type_="rate_limit_error",
                    headers={"retry-after": "3600", **headers},
                )
            batch.update(
                status="failed",
                in_progress_at=None,
                failed_at=now,
                errors={"object": "list", "data": checked.errors},
            )
            await self._storage(self._lines.create, caller.owner, batch, [], 0)
            return _json(public(batch), headers)
        await self._storage(self._lines.create, caller.owner, batch, checked.plan, checked.tokens)
        try:
            await self._storage(self._enqueue, caller.owner, batch, checked.plan)
        except QueueUnavailable as exc:
            await self._storage(self._lines.discard, caller.owner, batch_id)
            raise OpenAIError(
                503,
                f"The job queue is unavailable ({exc}); no batch was made. Retry later.",
                code="queue_unavailable",
                type_="server_error",
                headers={"retry-after": "5", **headers},
            ) from exc
        return _json(public(batch), headers)

    async def _check(
        self, caller: Caller, spec: OpenAIBatchCreate, headers: dict[str, str]
    ) -> Checked:
        """The input's check: from the plan stored at upload (one small read), or, without
        one that holds, by reading the whole file into a spool slot."""
        limits = caller.key.limits if caller.key is not None else None
        rules = self.rules(spec.endpoint, limits.tokens_per_minute if limits else None)
        stored = await self._reads(caller, self._files.plan, caller.owner, spec.input_file_id)
        checked = from_plan(stored, rules)
        if checked is None:
            self._slots.take(caller.owner, headers, doing="checking")
            try:
                checked = await self._read_and_check(caller, spec, rules)
            finally:
                self._slots.release(caller.owner)
        if checked.model is not None and not checked.errors:
            try:
                self._gatekeeper.check_model(caller, checked.model)
            except OpenAIError as err:
                checked.error("model_not_found", err.message, 1, "body.model")
        return checked

    def rules(self, endpoint: str, tokens_per_minute: int | None = None) -> LineRules:
        """What a batch's lines are checked against, here and at upload (FilesAPI)."""
        return LineRules(
            endpoint,
            self._settings.chunk_lines,
            self._chars,
            self._max_output,
            tokens_per_minute,
            self._max_body,
        )

    async def _read_and_check(
        self, caller: Caller, spec: OpenAIBatchCreate, rules: LineRules
    ) -> Checked:
        with tempfile.TemporaryDirectory(prefix="tiergate-batch-") as tmp:
            path = Path(tmp) / "input"
            # Charged to the key's read budget, bytes included, as a download of it is.
            if not await self._reads(
                caller, self._files.content_to, caller.owner, spec.input_file_id, path
            ):
                raise OpenAIError(
                    400, "The input file's content is missing.", param="input_file_id"
                )
            checked: Checked = await self._check_on(check_input, path, rules)
            return checked

    def _enqueue(self, owner: str, batch: dict[str, Any], plan: list[list[int]]) -> None:
        for index in range(len(plan)):
            self._queue.send_chunk(chunk_message(owner, batch, plan, index))

    async def _current(self, caller: Caller, batch_id: str) -> dict[str, Any]:
        if not _BATCH_ID.fullmatch(batch_id):
            raise _not_found(batch_id)
        batch = await self._reads(caller, self._finalizer.current, caller.owner, batch_id)
        if batch is None:
            raise _not_found(batch_id)
        return dict(batch)

    async def retrieve(self, request: Request, batch_id: str) -> Response:
        return _json(public(await self._current(self._caller(request), batch_id)))

    async def cancel(self, request: Request, batch_id: str) -> Response:
        """``cancelling`` (idempotent); final once its chunks in flight end."""
        caller = self._caller(request)
        for _ in range(5):
            batch = await self._current(caller, batch_id)
            if batch["status"] in FINAL or batch["status"] in ("cancelling", "finalizing"):
                return _json(public(batch))
            got = await self._storage(self._lines.get, caller.owner, batch_id)
            if got is None:
                raise _not_found(batch_id)
            stored, etag = got
            if stored["status"] != "in_progress":
                continue
            stored.update(status="cancelling", cancelling_at=int(time.time()))
            if await self._storage(self._lines.update, caller.owner, stored, etag):
                return _json(public(stored))
        raise OpenAIError(409, "The batch is changing; retry.", code="conflict")

    def _page(self, owner: str, after: str | None, limit: int) -> tuple[list[dict[str, Any]], bool]:
        """A page of the owner's batches, newest first (one metered read), and whether more
        follow."""
        ids = self._lines.ids(owner)
        ids.reverse()
        if after is not None:
            ids = [i for i in ids if i < after]
        data = []
        for batch_id in ids[:limit]:
            batch = self._finalizer.current(owner, batch_id)
            if batch is not None:
                data.append(public(batch))
        return data, len(ids) > limit

    async def list(self, request: Request, after: str | None, limit: int) -> Response:
        """Newest first, as OpenAI lists batches."""
        caller = self._caller(request)
        data, more = await self._reads(caller, self._page, caller.owner, after, limit)
        return _json(list_page(data, more))
