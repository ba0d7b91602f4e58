"""Typed answers of the jobs API. Unknown fields are kept (``extra="allow"``), so a newer
gateway's additions reach the caller; the job's status and result are the gateway's own
models (:mod:`tiergate.queue.schema`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tiergate.queue.schema import JobResult, JobStatus, ReplayReport

TERMINAL_STATUSES = frozenset(s.value for s in JobStatus if s.terminal)
TERMINAL_EVENTS = frozenset(f"job.{s}" for s in TERMINAL_STATUSES)


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Job(_Open):
    """``GET /v1/jobs/{id}``: a job as its owner sees it."""

    id: str
    object: str = "job"
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
    # Presigned URLs: trajectory, workspace, verifier_log, result (once they exist).
    artifacts: dict[str, str] = Field(default_factory=dict)
    # ``replay``: an earlier job (``replay_of``) run again without the model; its report.
    kind: str = "agent"
    replay_of: str | None = None
    replay: ReplayReport | None = None

    @property
    def terminal(self) -> bool:
        return self.status.terminal

    @property
    def passed(self) -> bool:
        """Completed, and its verifier passed."""
        return self.status is JobStatus.COMPLETED and self.result is not None and self.result.passed


class JobEvent(_Open):
    """One event of ``GET /v1/jobs/{id}/events``. ``type`` is ``job.queued``,
    ``job.in_progress``, ``job.step``, ``job.verified``, ``job.retrying`` or a terminal
    ``job.<status>``; the fields that a type carries are set, the others None."""

    type: str
    sequence_number: int
    created_at: int | None = None
    status: str | None = None
    attempt: int | None = None
    # job.step
    step: int | None = None
    command: str | None = None
    exit_code: int | None = None
    output: str | None = None
    # job.verified
    reward: float | None = None
    # job.retrying
    delay_seconds: float | None = None
    # a terminal event: the job as it ended (without artifacts; get the job for those)
    job: Job | None = None

    @property
    def terminal(self) -> bool:
        return self.type in TERMINAL_EVENTS


class JobList(_Open):
    """A page of ``GET /v1/jobs``, newest first."""

    object: str = "list"
    data: list[Job]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False
