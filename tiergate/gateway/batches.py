"""The batches API (``/v1/jobs/batches``): record a batch, read it, cancel it, export its
rollouts. The gateway checks every task as it would check a job (caps, model, tier, queue
message size) and records the batch; the workers schedule its jobs
(tiergate.queue.batches). A batch, like a job, exists only for the key that created it."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import orjson
from fastapi import Request
from pydantic import ValidationError
from starlette.responses import Response, StreamingResponse

from tiergate.gateway.errors import OpenAIError
from tiergate.gateway.jobs import JobsAPI, _invalid, json_response
from tiergate.gateway.selection import parse_body, read_body
from tiergate.protocol.batches import Batch, BatchCreate
from tiergate.queue.batches.export import rollout_record
from tiergate.queue.batches.store import BatchStore
from tiergate.queue.store import JobStore

# A task's own metadata leaves room for the four keys a batch's job gets (batch_id, ...).
MAX_TASK_METADATA = 12


class BatchesAPI:
    def __init__(self, jobs: JobsAPI, store: JobStore, max_body_bytes: int) -> None:
        self._jobs = jobs
        self._store = store
        self._batches = BatchStore(store)
        self._max_body_bytes = max_body_bytes

    async def create(self, request: Request) -> Response:
        caller = self._jobs.caller(request)
        body = parse_body(await read_body(request, self._max_body_bytes))
        try:
            spec = BatchCreate.model_validate(body)
        except ValidationError as exc:
            raise _invalid(exc) from None
        for index, task in enumerate(spec.tasks):
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
        unknown = set(spec.domain_weights) - {t.domain for t in spec.tasks}
        if unknown:
            raise OpenAIError(
                400,
                f"domain_weights names domains with no task: {sorted(unknown)}.",
                param="domain_weights",
            )
        headers = await self._jobs.count(caller)
        now = int(time.time())
        batch = Batch(
            id=f"batch_{uuid.uuid4().hex}",
            owner=caller.name,
            created_at=now,
            samples_per_task=spec.samples_per_task,
            rounds=spec.rounds,
            metadata=spec.metadata,
        )
        cap = self._jobs.outstanding_cap(caller)
        await self._jobs.storage(self._batches.create, batch, spec, cap)
        return json_response(batch.public(), headers=headers)

    async def _owned(self, request: Request, batch_id: str) -> Batch:
        caller = self._jobs.caller(request)
        batch: Batch | None = await self._jobs.storage(self._batches.state, caller.name, batch_id)
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
        batch = await self._owned(request, batch_id)
        caller = self._jobs.caller(request)
        return await self._jobs.streams.open_batch(
            caller, lambda: self._batches.state(batch.owner, batch.id)
        )

    async def rollouts(self, request: Request, batch_id: str) -> Response:
        """The finished rollouts as JSON lines (see tiergate.queue.batches.export)."""
        batch = await self._owned(request, batch_id)
        spec = await self._jobs.storage(self._batches.request, batch.owner, batch.id)
        done = [r for r in batch.rollouts if r.status in ("completed", "incomplete")]

        async def lines() -> AsyncIterator[bytes]:
            for rollout in done:
                record = await asyncio.to_thread(rollout_record, self._store, spec, rollout)
                yield orjson.dumps(record) + b"\n"

        return StreamingResponse(lines(), media_type="application/jsonl")
