"""Wire models of the jobs API (they import nothing else of tiergate's)."""

from __future__ import annotations

import posixpath
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator


class JobStatus(StrEnum):
    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INCOMPLETE = "incomplete"

    @property
    def terminal(self) -> bool:
        return self not in (JobStatus.QUEUED, JobStatus.IN_PROGRESS)


class _Strict(BaseModel):
    model_config = {"extra": "forbid"}


class Workspace(_Strict):
    """The starting files: inline, or a tar archive in object storage (``s3://bucket/key``)."""

    files: dict[str, str] | None = None
    url: str | None = Field(None, pattern=r"^s3://[^/]+/.+")

    @model_validator(mode="after")
    def _one(self) -> Workspace:
        if self.files is not None and self.url is not None:
            raise ValueError("give workspace.files or workspace.url, not both")
        for path in self.files or {}:
            norm = posixpath.normpath(path)
            if path.startswith("/") or norm.startswith("..") or norm in (".", ""):
                raise ValueError(
                    f"workspace.files: {path!r} must be a relative path inside the workspace"
                )
        return self


class Verifier(_Strict):
    """Run after the agent stops; exit status 0 passes. A reward file, if written, gives
    the reward (a number)."""

    command: str = Field(min_length=1)
    timeout_seconds: float = Field(60.0, gt=0, le=3600)
    reward_file: str | None = None


class JobLimits(_Strict):
    max_steps: int = Field(20, ge=1, le=500)
    timeout_seconds: float = Field(600.0, gt=0, le=6 * 3600)
    cpus: float = Field(1.0, gt=0, le=64)
    memory_mb: int = Field(1024, ge=16, le=256 * 1024)
    disk_mb: int = Field(1024, ge=1, le=1024 * 1024)


class JobCreate(_Strict):
    """``POST /v1/jobs``: everything but ``model`` and ``instruction`` has a default."""

    model: str = Field(min_length=1)
    instruction: str = Field(min_length=1, max_length=100_000)
    service_tier: str = "auto"
    workspace: Workspace = Field(default_factory=Workspace)
    setup: list[str] = Field(default_factory=list, max_length=50)
    verifier: Verifier | None = None
    limits: JobLimits = Field(default_factory=JobLimits)
    metadata: dict[str, str] = Field(default_factory=dict, max_length=16)

    @field_validator("metadata")
    @classmethod
    def _small(cls, value: dict[str, str]) -> dict[str, str]:
        for k, v in value.items():
            if len(k) > 64 or len(v) > 512:
                raise ValueError("metadata keys are at most 64 characters, values 512")
        return value


class JobResult(BaseModel):
    passed: bool
    reward: float | None = None
    verifier_exit_code: int | None = None


class Job(BaseModel):
    """The job object, as every replica and worker sees it (stored in object storage)."""

    id: str
    object: Literal["job"] = "job"
    owner: str
    status: JobStatus
    model: str
    service_tier: str
    created_at: int
    started_at: int | None = None
    completed_at: int | None = None
    steps: int = 0
    attempts: int = 0
    result: JobResult | None = None
    error: dict[str, Any] | None = None
    incomplete_details: dict[str, str] | None = None
    cancel_requested_at: int | None = None
    metadata: dict[str, str] = Field(default_factory=dict)

    def public(self, artifacts: dict[str, str]) -> dict[str, Any]:
        body = self.model_dump(mode="json", exclude={"owner"})
        body["artifacts"] = artifacts
        return body


class JobMessage(BaseModel):
    """What travels on Kafka: the job id, its owner, the spec and the attempt number."""

    id: str
    owner: str
    spec: JobCreate
    attempt: int = 1
    not_before: float = 0.0
