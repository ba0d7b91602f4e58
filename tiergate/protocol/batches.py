"""Rollout batches (``/v1/jobs/batches``): many tasks across domains, several samples of
each, run as ordinary jobs of the batch's owner and scheduled by the workers
(tiergate.jobs.batches). The docstrings are published in the OpenAPI description."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from tiergate.protocol.base import Strict
from tiergate.protocol.spec import JobCreate

DOMAIN_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
MAX_BATCH_TASKS = 20_000


class BatchTask(JobCreate):
    """One task: an ordinary job spec, with the domain it belongs to and its id in it."""

    domain: str = Field(pattern=DOMAIN_PATTERN)
    task_id: str = Field(min_length=1, max_length=128)

    def job_spec(self) -> JobCreate:
        return JobCreate.model_validate(self.model_dump(exclude={"domain", "task_id"}))


class BatchBudget(Strict):
    """The most the batch may spend: jobs submitted, and model tokens (prompt and
    completion, as the gateway counted them) of the rollouts finished. Once either is
    reached no further sample starts; what runs finishes."""

    max_jobs: int | None = Field(None, ge=1)
    max_tokens: int | None = Field(None, ge=1)


class AdaptiveSampling(Strict):
    """Sampling that follows the signal (optional; off when absent). Each time
    ``every`` more of a domain's rollouts have been scored, its weight's factor is
    multiplied by ``step`` if the pass rate of its latest ``every`` scored rollouts is
    inside ``target_pass_rate`` (neither solved nor hopeless), divided by it otherwise,
    kept within ``[min_factor, max_factor]`` (a domain with samples left always keeps at
    least one slot, so none starves). With ``variance_first``, a domain's extra samples go
    first to the tasks whose rewards so far vary most (round 1's samples before any)."""

    target_pass_rate: tuple[float, float] = (0.2, 0.8)
    every: int = Field(8, ge=1, le=10_000)
    step: float = Field(1.5, gt=1, le=10)
    min_factor: float = Field(0.25, gt=0, le=1)
    max_factor: float = Field(4.0, ge=1, le=100)
    variance_first: bool = True

    @model_validator(mode="after")
    def _band(self) -> AdaptiveSampling:
        low, high = self.target_pass_rate
        if not 0 <= low < high <= 1:
            raise ValueError("target_pass_rate: [low, high] with 0 <= low < high <= 1")
        return self


class BatchCreate(Strict):
    """A batch: ``tasks`` inline, or ``tasks_upload_id``, a JSON-lines file of them
    uploaded with ``POST /v1/jobs/batches/tasks`` (one task a line); ``samples_per_task``
    samples of each in the first round; in each of
    ``rounds - 1`` later rounds a task whose samples so far neither all passed nor all
    failed gets ``samples_per_task`` more (``extra_samples`` to set another number), up to
    the budget. A round is each task's own (``schedule: per_task``, the default): a task's
    next samples start as soon as its own have ended, whatever the other tasks do;
    ``schedule: rounds`` waits instead for every rollout of the batch before any next
    round (the barrier, kept to compare against). ``domain_weights`` share the running
    jobs between domains (1 each when not given); ``max_in_flight`` is how many of the
    batch's jobs run or wait at once."""

    tasks: list[BatchTask] = Field(default_factory=list, max_length=MAX_BATCH_TASKS)
    tasks_upload_id: str | None = Field(None, pattern=r"^upl_[0-9a-f]{32}$")
    samples_per_task: int = Field(4, ge=1, le=64)
    rounds: int = Field(1, ge=1, le=16)
    extra_samples: int | None = Field(None, ge=1, le=64)
    schedule: Literal["per_task", "rounds"] = "per_task"
    adaptive: AdaptiveSampling | None = None
    # Cut the tail: a rollout that has held its slot longer than this many times the
    # median of its domain's scored rollouts (once five have been) is cancelled; it is
    # recorded as cancelled and never scored, and its group completes without it.
    tail_cut: float | None = Field(None, gt=1, le=1000)
    # Over-provision: start this many samples more than each round's group needs; once a
    # round has as many scored samples as its group, the rest are cancelled (recorded as
    # cancelled, never scored: the stragglers of the round).
    overprovision: int = Field(0, ge=0, le=16)
    # Policy versions: every rollout records the version current when it started (from
    # policy_version, then as a trainer announces them: POST .../policy_version). With
    # max_staleness, a sample more than that many versions behind the current one is not
    # started: its queued job is cancelled and the sample runs again under the current
    # version (and, with cancel_stale_running, a running one too).
    policy_version: int = Field(0, ge=0)
    max_staleness: int | None = Field(None, ge=0)
    cancel_stale_running: bool = False
    domain_weights: dict[str, float] = Field(default_factory=dict)
    budget: BatchBudget = Field(default_factory=BatchBudget)
    max_in_flight: int = Field(8, ge=1, le=1024)
    # Rewards clipped to +-clip after the per-domain scale normalization (docs/batches.md).
    advantage_clip: float = Field(5.0, gt=0)
    metadata: dict[str, str] = Field(default_factory=dict)

    def group_size(self, round_: int) -> int:
        """The scored samples a task's round needs: ``samples_per_task`` in round 1,
        ``extra_samples`` (else the same) after."""
        return self.samples_per_task if round_ == 1 else self.extra_samples or self.samples_per_task

    def round_size(self, round_: int) -> int:
        """The samples a task's round starts: its group, and ``overprovision`` more."""
        return self.group_size(round_) + self.overprovision

    def round_of(self, sample: int) -> int:
        """The round a task's ``sample`` (its number, from 0) belongs to."""
        first, later = self.round_size(1), self.round_size(2)
        return 1 if sample < first else 2 + (sample - first) // later

    def most_rollouts(self, tasks: int | None = None) -> int:
        """The most jobs the batch may start: every task's samples in every round, or the
        budget's ``max_jobs`` if lower (``tasks``: how many it has, if not inline)."""
        count = len(self.tasks) if tasks is None else tasks
        planned = count * (self.round_size(1) + (self.rounds - 1) * self.round_size(2))
        return min(planned, self.budget.max_jobs or planned)

    @model_validator(mode="after")
    def _tasks_once(self) -> BatchCreate:
        if bool(self.tasks) == bool(self.tasks_upload_id):
            raise ValueError("give the batch's tasks either inline (tasks) or as tasks_upload_id")
        seen: set[tuple[str, str]] = set()
        for task in self.tasks:
            key = (task.domain, task.task_id)
            if key in seen:
                raise ValueError(f"task {task.task_id!r} appears twice in domain {task.domain!r}")
            seen.add(key)
        for domain, weight in self.domain_weights.items():
            if weight <= 0:
                raise ValueError(f"domain_weights.{domain}: a weight is positive")
        return self


class Rollout(BaseModel):
    """One sample of one task: the job that ran it and what it scored."""

    job_id: str
    domain: str
    task_id: str
    sample: int
    round: int
    status: str = "queued"
    passed: bool | None = None
    reward: float | None = None
    # Its verifier's named rewards, when it wrote several (JobResult.rewards).
    rewards: dict[str, float] | None = None
    advantage: float | None = None
    reward_normalized: float | None = None
    normalized_advantage: float | None = None
    tokens: int = 0
    service_tier: str | None = None
    environment_digest: str | None = None
    error_code: str | None = None
    # When its job was picked up and ended (epoch seconds, from the job's record).
    started_at: int | None = None
    ended_at: int | None = None
    # The model and the policy version it ran with (the version current when it started).
    model: str | None = None
    policy_version: int | None = None


class Skip(BaseModel):
    """Something the scheduler chose not to run, and why."""

    domain: str
    task_id: str | None = None
    reason: Literal["saturated", "budget", "domain_removed", "cancelled", "tail_cut", "stale"]
    detail: str


class PolicyVersion(Strict):
    """A trainer's announcement: the policy version the model now serves."""

    version: int = Field(ge=0)


class WeightChange(BaseModel):
    """A domain's weight factor moved (``adaptive``), and why."""

    domain: str
    previous: float
    factor: float
    pass_rate: float
    scored: int
    reason: str


class Allocation(BaseModel):
    """A task's next round planned: how many samples, and why."""

    domain: str
    task_id: str
    round: int
    samples: int
    reason: str


class GroupRef(BaseModel):
    """A complete group: one task's samples of one round, all ended (or the batch ended
    before its round did). ``seq`` counts the batch's groups in the order they completed,
    from 1: a reader resumes after the last it took (``starting_after``)."""

    seq: int
    domain: str
    task_id: str
    round: int
    completed_at: float


class Batch(BaseModel):
    """The batch as its owner reads it: status, counts, per-domain and per-task figures
    (``stats``), the skips, and each rollout."""

    id: str
    object: Literal["jobs.batch"] = "jobs.batch"
    owner: str
    status: Literal["in_progress", "completed", "cancelled"] = "in_progress"
    created_at: int
    completed_at: int | None = None
    samples_per_task: int
    rounds: int
    # per_task: each task goes on to its next round alone; rounds: the whole batch at once.
    schedule: Literal["per_task", "rounds"] = "rounds"
    # The furthest round any task has reached (every task's, with the rounds schedule).
    round: int = 1
    # Samples planned per task ("domain/task_id"), once a later round added some.
    planned: dict[str, int] = Field(default_factory=dict)
    domains: dict[str, dict[str, Any]] = Field(default_factory=dict)
    removed_domains: dict[str, str] = Field(default_factory=dict)
    counts: dict[str, int] = Field(default_factory=dict)
    tokens: int = 0
    skips: list[Skip] = Field(default_factory=list)
    allocations: list[Allocation] = Field(default_factory=list)
    # adaptive: each domain's factor on its weight, every change of it, and how many of
    # its rollouts were scored when it was last weighed.
    weight_factors: dict[str, float] = Field(default_factory=dict)
    weight_changes: list[WeightChange] = Field(default_factory=list)
    weighed_at: dict[str, int] = Field(default_factory=dict)
    groups: list[GroupRef] = Field(default_factory=list)
    # The rollouts cut as the tail (tail_cut), and those cancelled as a satisfied round's
    # surplus (overprovision), by job id.
    cut: list[str] = Field(default_factory=list)
    surplus: list[str] = Field(default_factory=list)
    # The policy version now (the request's, then the latest a trainer announced), and
    # the rollouts withdrawn as too stale (their samples ran again).
    policy_version: int = 0
    stale: list[Rollout] = Field(default_factory=list)
    rollouts: list[Rollout] = Field(default_factory=list)
    metadata: dict[str, str] = Field(default_factory=dict)

    def public(self, with_rollouts: bool = False) -> dict[str, Any]:
        exclude = {"owner"} if with_rollouts else {"owner", "rollouts"}
        return self.model_dump(mode="json", exclude=exclude)
