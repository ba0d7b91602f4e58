"""The batches API (``/v1/jobs/batches``): record a batch, read it, cancel it, export its
rollouts. The gateway checks every task as it would check a job (caps, model, tier, queue
message size) and records the batch; the workers schedule its jobs
(tiergate.jobs.batches). A batch, like a job, exists only for the key that created it."""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
from fastapi import Request
from pydantic import ValidationError
from starlette.responses import Response, StreamingResponse

from tiergate.gateway.access.auth import Caller
from tiergate.gateway.errors import OpenAIError
from tiergate.gateway.jobs.api import JobsAPI, _invalid, json_response
from tiergate.gateway.jobs.reserve import Reservations, Ticket
from tiergate.gateway.jobs.taskfile import TaskSummary, write_request
from tiergate.gateway.jobs.uploads import BATCH_TASKS
from tiergate.gateway.openai.selection import parse_body, read_body
from tiergate.jobs.batches.export import rollout_record
from tiergate.jobs.batches.groups import members
from tiergate.jobs.batches.groups import record as group_record
from tiergate.jobs.batches.store import BatchStore
from tiergate.jobs.state.store import JobStore
from tiergate.jobsettings import JobsSettings
from tiergate.protocol.batches import Batch, BatchCreate, BatchTask, GroupRef, PolicyVersion

# A task's own metadata leaves room for the four keys a batch's job gets (batch_id, ...).
MAX_TASK_METADATA = 12


class BatchesAPI:
    def __init__(
        self, jobs: JobsAPI, store: JobStore, max_body_bytes: int, settings: JobsSettings
    ) -> None:
        self._jobs = jobs
        self._settings = settings
        self._store = store
        self._batches = BatchStore(store)
        self._reservations = Reservations()
        self._max_body_bytes = max_body_bytes

    async def create(self, request: Request) -> Response:
        caller = self._jobs.caller(request)
        body = parse_body(await read_body(request, self._max_body_bytes))
        with self._reservations.ticket(caller.owner) as ticket:
            return await self._create(caller, body, ticket)

    async def _create(self, caller: Caller, body: Any, ticket: Ticket) -> Response:
        try:
            spec = BatchCreate.model_validate(body)
        except ValidationError as exc:
            raise _invalid(exc) from None
        headers: dict[str, str] | None = None
        with tempfile.TemporaryDirectory(prefix="tiergate-batch-") as scratch:
            request: bytes | Path
            if spec.tasks_upload_id:
                # Counted and capped before the file (up to jobs.max_batch_tasks_bytes) is
                # read: many parallel creates naming it must not each cost that.
                headers = await self._admit(caller, ticket)
                request = Path(scratch) / "request.json"
                summary = await self._uploaded_tasks(caller, spec, request)
            else:
                summary = TaskSummary()
                for index, task in enumerate(spec.tasks):
                    self._check_task(caller, index, task)
                    summary.add(index, task)
                request = spec.model_dump_json().encode()
            self._check_summary(spec, summary)
            await self._check_uploads(caller, summary)
            if headers is None:
                headers = await self._admit(caller, ticket)
            now = int(time.time())
            batch = Batch(
                id=f"batch_{uuid.uuid4().hex}",
                owner=caller.owner,
                created_at=now,
                samples_per_task=spec.samples_per_task,
                rounds=spec.rounds,
                schedule=spec.schedule,
                metadata=spec.metadata,
            )
            cap = self._jobs.outstanding_cap(caller)
            await self._jobs.storage(self._batches.create, batch, request, cap)
        return json_response(batch.public(), headers=headers)

    def _check_task(self, caller: Caller, index: int, task: BatchTask) -> None:
        """400 for a task the caller could not submit as a job (or with too much metadata),
        naming it by its index."""
        if len(task.metadata) > MAX_TASK_METADATA:
            raise OpenAIError(
                400,
                f"tasks.{index}.metadata: a batch's task has at most {MAX_TASK_METADATA} "
                "keys (its job gets four more: batch_id, batch_domain, batch_task_id, "
                "batch_sample).",
                param=f"tasks.{index}.metadata",
            )
        try:
            self._jobs.check_spec(caller, task.job_spec())
        except OpenAIError as err:
            err.message = f"tasks.{index}: {err.message}"
            raise

    def _check_summary(self, spec: BatchCreate, summary: TaskSummary) -> None:
        unknown = set(spec.domain_weights) - summary.domains
        if unknown:
            raise OpenAIError(
                400,
                f"domain_weights names domains with no task: {sorted(unknown)}.",
                param="domain_weights",
            )
        most, cap = spec.most_rollouts(summary.count), self._settings.max_batch_rollouts
        if most > cap:
            raise OpenAIError(
                400,
                f"The batch plans up to {most} rollouts (tasks x samples over its rounds), "
                f"over this installation's limit (jobs.max_batch_rollouts: {cap}); set "
                "budget.max_jobs, or split it into several batches.",
                param="budget.max_jobs",
                code="batch_too_large",
            )

    async def _admit(self, caller: Caller, ticket: Ticket) -> dict[str, str]:
        """Count the create against the key's requests per minute (429 when over) and its
        unfinished batches, with the creates of the key that took their ticket first
        (tiergate.gateway.jobs.reserve), against jobs.max_active_batches (429); the rate-limit
        headers."""
        headers = await self._jobs.count(caller)
        limit = self._settings.max_active_batches
        active = await self._jobs.storage(self._batches.active_of, caller.owner, limit)
        if active + ticket.ahead() >= limit:
            raise OpenAIError(
                429,
                f"This key has {limit} unfinished batches, its limit "
                "(jobs.max_active_batches); wait for one to finish or cancel one.",
                code="too_many_batches",
                type_="rate_limit_error",
                headers={"retry-after": "30", **headers},
            )
        return headers

    async def upload_tasks(self, request: Request) -> Response:
        """A tasks file (tiergate.gateway.jobs.taskfile), received as a workspace upload is."""
        caller = self._jobs.caller(request)
        answer, headers = await self._jobs.uploads.receive(caller, request, BATCH_TASKS)
        return json_response(answer, headers=headers)

    async def _uploaded_tasks(self, caller: Caller, spec: BatchCreate, out: Path) -> TaskSummary:
        """The batch's request, with the tasks of its upload, written to ``out`` a task at a
        time as each is read and checked (tiergate.gateway.jobs.taskfile.write_request): the
        gateway never holds them whole."""
        upload_id = spec.tasks_upload_id
        assert upload_id is not None
        await self._jobs.check_upload(caller, upload_id, "tasks_upload_id")
        header = spec.model_dump_json(exclude={"tasks", "tasks_upload_id"}).encode()

        def write() -> TaskSummary | None:
            tasks = out.with_name("tasks.jsonl")
            if not self._store.read_upload_to(caller.owner, upload_id, tasks):
                return None
            with tasks.open("rb") as file, out.open("wb") as request:
                return write_request(
                    file, header, request, lambda i, task: self._check_task(caller, i, task)
                )

        summary: TaskSummary | None = await self._jobs.storage(write)
        if summary is None:  # deleted since it was looked at
            raise OpenAIError(
                400,
                f"No tasks upload {upload_id!r} for this key (POST /v1/jobs/batches/tasks).",
                param="tasks_upload_id",
                code="upload_not_found",
            )
        return summary

    async def _check_uploads(self, caller: Caller, summary: TaskSummary) -> None:
        """Every workspace upload the tasks name is the caller's and live, as a job's is
        checked at submit. A key holds at most jobs.max_uploads_per_key of them, so more
        distinct names than that are refused before any is looked up."""
        named = summary.uploads
        most = self._settings.max_uploads_per_key
        if len(named) > most:
            raise OpenAIError(
                400,
                f"The tasks name {len(named)} workspace uploads; a key holds at most {most} "
                "(jobs.max_uploads_per_key).",
                param="tasks",
                code="too_many_uploads",
            )
        for upload_id, index in named.items():
            await self._jobs.check_upload(caller, upload_id, f"tasks.{index}.workspace.upload_id")

    async def _owned(self, request: Request, batch_id: str) -> Batch:
        caller = self._jobs.caller(request)
        batch: Batch | None = await self._jobs.read(
            caller, self._batches.state, caller.owner, batch_id
        )
        if batch is None:
            raise OpenAIError(
                404, f"No batch with id {batch_id!r}.", param="batch_id", code="batch_not_found"
            )
        return batch

    async def get(self, request: Request, batch_id: str) -> Response:
        batch = await self._owned(request, batch_id)
        return json_response(batch.public(with_rollouts=True))

    async def cancel(self, request: Request, batch_id: str) -> Response:
        """Idempotent: nothing more starts; its queued jobs are cancelled by its scheduler
        within a pass, running ones end as they do."""
        batch = await self._owned(request, batch_id)
        if batch.status == "in_progress":
            await self._jobs.storage(self._batches.request_cancel, batch.owner, batch.id)
        return json_response(batch.public())

    async def events(self, request: Request, batch_id: str) -> Response:
        """Server-Sent Events: each rollout as it finishes, then the batch's end."""
        caller = self._jobs.caller(request)
        batch = await self._owned(request, batch_id)
        # The stream's polls read the state again only when it changed (its ETag).
        return await self._jobs.streams.open_batch(
            caller, self._batches.state_reader(batch.owner, batch.id)
        )

    async def rollouts(self, request: Request, batch_id: str) -> Response:
        """The finished rollouts as JSON lines (see tiergate.jobs.batches.export)."""
        caller = self._jobs.caller(request)
        batch = await self._owned(request, batch_id)
        spec = await self._jobs.read(caller, self._batches.request, batch.owner, batch.id)
        done = [r for r in batch.rollouts if r.status in ("completed", "incomplete")]
        reads = self._jobs.reads

        async def lines() -> AsyncIterator[bytes]:
            # Each record is a read of its own, paid for as the export goes: past the
            # owner's budget the export slows down rather than failing halfway.
            for rollout in done:
                record = await reads.read_when_allowed(
                    caller, self._jobs.threads.store, rollout_record, self._store, spec, rollout
                )
                yield orjson.dumps(record) + b"\n"

        return StreamingResponse(lines(), media_type="application/jsonl")

    async def _group(
        self, caller: Caller, spec: BatchCreate | None, batch: Batch, ref: GroupRef
    ) -> dict[str, Any]:
        """One group's record; each sample's record is a read of its own, paid for as it
        goes (past the owner's budget the reader slows down rather than failing)."""
        rollouts = members(batch, ref)
        samples = [
            await self._jobs.reads.read_when_allowed(
                caller, self._jobs.threads.store, rollout_record, self._store, spec, rollout
            )
            for rollout in rollouts
        ]
        return group_record(ref, rollouts, samples)

    async def groups(
        self, request: Request, batch_id: str, starting_after: int, limit: int
    ) -> Response:
        """The complete groups after ``starting_after``, at most ``limit``, as JSON lines
        (tiergate.jobs.batches.groups)."""
        caller = self._jobs.caller(request)
        batch = await self._owned(request, batch_id)
        spec = await self._jobs.read(caller, self._batches.request, batch.owner, batch.id)
        refs = [g for g in batch.groups if g.seq > starting_after][:limit]

        async def lines() -> AsyncIterator[bytes]:
            for ref in refs:
                yield orjson.dumps(await self._group(caller, spec, batch, ref)) + b"\n"

        # A reader pages until a page is empty and the batch has ended (its last groups
        # are recorded in the same write as its end).
        ended = batch.completed_at is not None
        headers = {
            "x-tiergate-batch-status": batch.status if ended else "in_progress",
            "x-tiergate-batch-groups": str(len(batch.groups)),
        }
        return StreamingResponse(lines(), media_type="application/jsonl", headers=headers)

    async def group_events(self, request: Request, batch_id: str, starting_after: int) -> Response:
        """Server-Sent Events: each group once as it completes, then the batch's end."""
        caller = self._jobs.caller(request)
        batch = await self._owned(request, batch_id)
        spec = await self._jobs.read(caller, self._batches.request, batch.owner, batch.id)

        async def build(current: Batch, ref: GroupRef) -> dict[str, Any]:
            return await self._group(caller, spec, current, ref)

        return await self._jobs.streams.open_batch_groups(
            caller, self._batches.state_reader(batch.owner, batch.id), starting_after, build
        )

    async def announce_policy_version(self, request: Request, batch_id: str) -> Response:
        """The policy version the model serves now: later rollouts record it, and with the
        batch's ``max_staleness`` the samples too far behind it run again. Versions only
        go forward (400 otherwise); the batch's scheduler takes it at its next pass."""
        caller = self._jobs.caller(request)
        try:
            announced = PolicyVersion.model_validate(
                parse_body(await read_body(request, self._max_body_bytes))
            )
        except ValidationError as exc:
            raise _invalid(exc) from None
        batch = await self._owned(request, batch_id)
        before = await self._jobs.read(
            caller, self._batches.announced_policy_version, batch.owner, batch.id
        )
        current = max(batch.policy_version, before or 0)
        if announced.version < current:
            raise OpenAIError(
                400,
                f"Policy versions only go forward: this batch is at version {current}.",
                param="version",
                code="policy_version_behind",
            )
        if batch.status == "in_progress":
            await self._jobs.storage(
                self._batches.announce_policy_version, batch.owner, batch.id, announced.version
            )
        return json_response(
            {
                "object": "jobs.batch.policy_version",
                "batch_id": batch.id,
                "version": announced.version,
                "status": batch.status,
            }
        )
