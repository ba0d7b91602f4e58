"""What a caller submits (``POST /v1/jobs``): the job's spec, checked at the gateway so a
worker never starts a job it would refuse. The docstrings of these models are published
in the OpenAPI description, so they are part of the wire format."""

from __future__ import annotations

import posixpath

from pydantic import Field, field_validator, model_validator

from tiergate.protocol.base import Strict, refuse_nul
from tiergate.protocol.limits import JobLimits

MAX_WORKSPACE_FILES = 1000
# An environment's name: short, lower case; it keys the environment's circuit breaker.
ENVIRONMENT_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"


class Workspace(Strict):
    """The starting files: inline, or a tar archive the same key uploaded earlier
    (``POST /v1/jobs/workspaces`` answers its ``id``). A job never names an arbitrary
    object: the worker reads uploads only under the job owner's own prefix."""

    files: dict[str, str] | None = Field(None, max_length=MAX_WORKSPACE_FILES)
    upload_id: str | None = Field(None, pattern=r"^upl_[0-9a-f]{32}$")

    @model_validator(mode="after")
    def _one(self) -> Workspace:
        if self.files is not None and self.upload_id is not None:
            raise ValueError("give workspace.files or workspace.upload_id, not both")
        refuse_nul(self.files or {}, "workspace.files")
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


class Verifier(Strict):
    """Run after the agent stops; exit status 0 passes. A reward file, if written, gives
    the reward (a number)."""

    command: str = Field(min_length=1, max_length=100_000)
    timeout_seconds: float = Field(60.0, gt=0, le=3600)
    reward_file: str | None = Field(None, max_length=1024)

    @model_validator(mode="after")
    def _clean(self) -> Verifier:
        refuse_nul([self.command, self.reward_file or ""], "verifier")
        return self


class JobCreate(Strict):
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
        refuse_nul(value, "metadata")
        return value

    @field_validator("setup")
    @classmethod
    def _commands(cls, value: list[str]) -> list[str]:
        for command in value:
            if not command.strip() or len(command) > 100_000:
                raise ValueError("each setup command is 1 to 100,000 characters")
        refuse_nul(value, "setup")
        return value

    @field_validator("instruction", "model", "service_tier")
    @classmethod
    def _text(cls, value: str) -> str:
        refuse_nul(value, "the text")
        return value
