"""The job as every replica, worker and client sees it, its status, and the message that
carries it on Kafka. The docstrings of these models are published in the OpenAPI
description, so they are part of the wire format (and the status enum has none)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field

from tiergate.protocol.replay import ReplayReport
from tiergate.protocol.spec import JobCreate


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

    @property
    def replayable(self) -> bool:
        """Whether a job that ended so can be replayed: it ran its agent, so it has a
        trajectory (a job that failed before its agent ran has none, which the replay
        checks on its own). A cancelled job stopped part-way through on purpose."""
        return self in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.INCOMPLETE)


TERMINAL_STATUSES = frozenset(s.value for s in JobStatus if s.terminal)
# The events a job's stream ends with, one per terminal status: ``job.<status>``.
TERMINAL_EVENTS = frozenset(f"job.{s}" for s in TERMINAL_STATUSES)


class JobResult(BaseModel):
    passed: bool
    reward: float | None = None
    # A verifier that scores several things writes them by name (their sum is ``reward``;
    # tiergate.jobs.run.jobsandbox.read_rewards).
    rewards: dict[str, float] | None = None
    verifier_exit_code: int | None = None


class Job(BaseModel):
    """The job object, as every replica and worker sees it (stored in object storage).

    ``kind`` is ``agent`` (the model drives the sandbox) or ``replay`` (an earlier job's
    recorded commands run again without the model, see :mod:`tiergate.jobs.run.replay`);
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
    # The run (lease epoch, tiergate.jobs.state.lease) that holds the job now, or that ended it:
    # its artifacts are the job's.
    run: int | None = None
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
        """The job as its owner reads it: without the owner (the caller) and the
        milliseconds, with the artifacts' presigned URLs (``artifacts``) last."""
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
