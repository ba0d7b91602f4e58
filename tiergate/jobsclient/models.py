"""Typed answers of the jobs API. Unknown fields are kept (``extra="allow"``), so a newer
gateway's additions reach the caller; the job is the gateway's own model
(:class:`tiergate.protocol.Job`), extended with what only its owner is sent."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from tiergate import protocol
from tiergate.protocol import TERMINAL_EVENTS, JobStatus


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Job(protocol.Job):
    """``GET /v1/jobs/{id}``: a job as its owner sees it."""

    model_config = ConfigDict(extra="allow")

    # The gateway never sends these (the owner is the caller): optional here, never dumped.
    owner: str = Field("", exclude=True)
    created_ms: int = Field(0, exclude=True)
    # Presigned URLs: trajectory, workspace, verifier_log, result (once they exist).
    artifacts: dict[str, str] = Field(default_factory=dict)

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
    # job.in_progress, job.step, job.verified, job.retrying: the run (its lease's epoch,
    # from 1) that wrote it. A run taken over writes nothing more, so a job's events never
    # go back to an earlier run.
    run: int | None = None
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


class Batch(protocol.Batch):
    """``GET /v1/jobs/batches/{id}``: a rollout batch as its owner sees it."""

    model_config = ConfigDict(extra="allow")

    owner: str = Field("", exclude=True)

    @property
    def finished(self) -> bool:
        """Nothing of it runs any more (completed, or cancelled and drained)."""
        return self.status != "in_progress" and self.completed_at is not None
