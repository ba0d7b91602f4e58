"""OpenAI's Batch API (``/v1/batches``): a file of plain model calls answered line by line
(tiergate.jobs.lines), apart from the agent jobs' rollout batches (``/v1/jobs/batches``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator

from tiergate.protocol.base import Strict

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings")
# The gateway's 429 for a key over its limits names the limit here (requests, tokens or
# concurrency): a batch line waits out the key's concurrency, never its rates.
LIMIT_HEADER = "x-tiergate-limit"

Endpoint = Literal["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings"]

# The statuses OpenAI's batch object goes through; the last five are final.
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
FINAL = ("failed", "completed", "expired", "cancelled")


class ExpiresAfter(Strict):
    anchor: Literal["created_at"] = "created_at"
    seconds: int = Field(ge=3600, le=30 * 24 * 3600)


class OpenAIBatchCreate(Strict):
    """OpenAI's ``POST /v1/batches`` body."""

    # A file id as POST /v1/files makes them: nothing else reaches the store's keys.
    input_file_id: str = Field(pattern=r"^file-[0-9a-f]{32}$")
    endpoint: Endpoint
    completion_window: Literal["24h"]
    metadata: dict[str, str] | None = None
    # Accepted as OpenAI's clients send it; output files here live until deleted.
    output_expires_after: ExpiresAfter | None = None

    @field_validator("metadata")
    @classmethod
    def _openai_metadata(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None:
            if len(value) > 16:
                raise ValueError("at most 16 pairs")
            for key, item in value.items():
                if len(key) > 64 or len(item) > 512:
                    raise ValueError("keys are at most 64 characters, values at most 512")
        return value


class ChunkMessage(BaseModel):
    """One chunk of a batch's lines, on the batch topic: bytes ``start``..``end`` of the
    input file, its lines ``first_line``.. (1-based). ``id`` keys the record."""

    id: str
    owner: str
    batch_id: str
    chunk: int = Field(ge=0)
    input_file_id: str
    endpoint: Endpoint
    start: int = Field(ge=0)
    end: int = Field(ge=0)
    first_line: int = Field(ge=1)
    expires_at: int
    # The chunk's lines (from the batch's plan): answered as errors, one each, when the
    # input file is gone (deleted by its owner while the batch ran). None on records an
    # older gateway sent.
    lines: int | None = Field(None, ge=0)
