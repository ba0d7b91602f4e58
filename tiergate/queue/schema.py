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


def _no_nul(value: Any, where: str) -> None:
    """A NUL byte cannot be in a command, a path or an argument: refuse it at submit."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError(f"{where} contains a NUL byte")
    elif isinstance(value, dict):
        for k, v in value.items():
            _no_nul(k, where)
            _no_nul(v, where)
    elif isinstance(value, list):
        for item in value:
            _no_nul(item, where)


class _Strict(BaseModel):
    model_config = {"extra": "forbid"}


MAX_WORKSPACE_FILES = 1000
# An environment's name: short, lower case; it keys the environment's circuit breaker.
ENVIRONMENT_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"


class Workspace(_Strict):
    """The starting files: inline, or a tar archive the same key uploaded earlier
    (``POST /v1/jobs/workspaces`` answers its ``id``). A job never names an arbitrary
    object: the worker reads uploads only under the job owner's own prefix."""

    files: dict[str, str] | None = Field(None, max_length=MAX_WORKSPACE_FILES)
    upload_id: str | None = Field(None, pattern=r"^upl_[0-9a-f]{32}$")

    @model_validator(mode="after")
    def _one(self) -> Workspace:
        if self.files is not None and self.upload_id is not None:
            raise ValueError("give workspace.files or workspace.upload_id, not both")
        _no_nul(self.files or {}, "workspace.files")
        paths = set()
        for path in self.files or {}:
            norm = posixpath.normpath(path)
            if path.startswith("/") or norm.startswith("..") or norm in (".", ""):
                raise ValueError(
                    f"workspace.files: {path!r} must be a relative path inside the workspace"
                )
            if norm in paths:
                raise ValueError(f"workspace.files: {path!r} is given twice")
            paths.add(norm)
        for norm in paths:
            parent = posixpath.dirname(norm)
            while parent:
                if parent in paths:
                    raise ValueError(
                        f"workspace.files: {parent!r} is a file and also a directory of {norm!r}"
                    )
                parent = posixpath.dirname(parent)
        return self


class Verifier(_Strict):
    """Run after the agent stops; exit status 0 passes. A reward file, if written, gives
    the reward (a number)."""

    command: str = Field(min_length=1, max_length=100_000)
    timeout_seconds: float = Field(60.0, gt=0, le=3600)
    reward_file: str | None = Field(None, max_length=1024)

    @model_validator(mode="after")
    def _clean(self) -> Verifier:
        _no_nul([self.command, self.reward_file or ""], "verifier")
        return self


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
    environment: str = Field(
        "default",
        pattern=ENVIRONMENT_PATTERN,
        description="The named environment the job runs in; its circuit breaker is kept per "
        "name (jobs of an environment whose infrastructure keeps failing end fast with "
        "environment_unavailable). A name registered with `tiergate env build` runs in that "
        "environment's root file system (its digest is recorded on the job as "
        'environment_digest); "default" runs in the worker\'s own system unless a '
        '"default" environment is registered; any other unknown name fails the job '
        "with environment_not_found.",
    )

    @field_validator("metadata")
    @classmethod
    def _small(cls, value: dict[str, str]) -> dict[str, str]:
        for k, v in value.items():
            if len(k) > 64 or len(v) > 512:
                raise ValueError("metadata keys are at most 64 characters, values 512")
        _no_nul(value, "metadata")
        return value

    @field_validator("setup")
    @classmethod
    def _commands(cls, value: list[str]) -> list[str]:
        for command in value:
            if not command.strip() or len(command) > 100_000:
                raise ValueError("each setup command is 1 to 100,000 characters")
        _no_nul(value, "setup")
        return value

    @field_validator("instruction", "model", "service_tier")
    @classmethod
    def _text(cls, value: str) -> str:
        _no_nul(value, "the text")
        return value


class JobResult(BaseModel):
    passed: bool
    reward: float | None = None
    verifier_exit_code: int | None = None


class Pair(BaseModel):
    """One quantity as the original job recorded it and as its replay saw it."""

    recorded: Any = None
    replayed: Any = None


class ReplayStep(BaseModel):
    """One recorded command run again. ``index`` is the original's step number (setup
    commands count from 1 in their own list). Outputs are compared in the form the sandbox
    captured them (bounded head and tail, ``jobs.sandbox.output_limit_chars``); both
    outputs are kept only when they differ."""

    index: int
    command: str
    exit_code: Pair
    exit_matches: bool
    output_matches: bool
    seconds: Pair = Field(default_factory=Pair)
    output: Pair | None = None


class ReplayVerifier(BaseModel):
    command: str
    exit_code: Pair
    reward: Pair
    passed: Pair
    exit_matches: bool
    output_matches: bool
    matches: bool


class ReplayReport(BaseModel):
    """A replay job's answer (``job.replay``): per step whether the exit status and the
    output match the original's trajectory; ``matches`` only if every setup command, step
    and the verifier match. ``environment`` is the original's environment identity
    ("default" where jobs name none)."""

    original: str
    environment: str = "default"
    # The digest of the environment the original (and so the replay) ran in; None: the
    # worker's own system.
    environment_digest: str | None = None
    setup: list[ReplayStep] = Field(default_factory=list)
    steps: list[ReplayStep] = Field(default_factory=list)
    verifier: ReplayVerifier | None = None
    matches: bool = False


class Job(BaseModel):
    """The job object, as every replica and worker sees it (stored in object storage).

    ``kind`` is ``agent`` (the model drives the sandbox) or ``replay`` (an earlier job's
    recorded commands run again without the model, see :mod:`tiergate.queue.replay`);
    a replay names its original in ``replay_of`` and answers with ``replay``."""

    id: str
    object: Literal["job"] = "job"
    owner: str
    status: JobStatus
    model: str
    service_tier: str
    created_at: int
    # Milliseconds, for listing newest first within one second; not part of the API.
    created_ms: int = 0
    started_at: int | None = None
    completed_at: int | None = None
    steps: int = 0
    attempts: int = 0
    result: JobResult | None = None
    error: dict[str, Any] | None = None
    incomplete_details: dict[str, str] | None = None
    cancel_requested_at: int | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    environment: str = "default"
    # The sha256 of the environment's root file system the job ran in (tiergate.envs);
    # None: the worker's own system (or not started yet).
    environment_digest: str | None = None
    kind: Literal["agent", "replay"] = "agent"
    replay_of: str | None = None
    replay: ReplayReport | None = None

    @property
    def created_at_ms(self) -> int:
        return self.created_ms or self.created_at * 1000

    def public(self, artifacts: dict[str, str]) -> dict[str, Any]:
        body = self.model_dump(mode="json", exclude={"owner", "created_ms"})
        body["artifacts"] = artifacts
        return body


class JobMessage(BaseModel):
    """What travels on Kafka: the job id, its owner, the spec and the attempt number."""

    id: str
    owner: str
    spec: JobCreate
    attempt: int = 1
    not_before: float = 0.0
    # Set when the sweep re-sends a job whose first message may never have reached the
    # broker: a worker then runs it only if it is still queued.
    resent: bool = False
    # A replay job: the original's id (the job record says so too, which is what a
    # message re-sent by the sweep, built from the spec alone, relies on).
    replay_of: str | None = None
