"""The worker's side of batches: every ``poll_seconds``, for each batch not finished, the
worker holding its lease (tiergate.jobs.state.lease: one scheduler per batch, taken over if
that worker goes away) reads the rollouts' jobs, normalizes the rewards, decides what runs
next (:func:`.schedule.decide`), creates those jobs and writes the batch's state.

A batch's jobs are ordinary jobs of its owner: created through :class:`JobLifecycle` and
the jobs topic like any other, so limits, quotas, tiers, environments, breakers and replay
apply; the owner's cap on unfinished jobs is kept (the scheduler starts no more than its
room). A job's id is derived from the batch, task and sample, so a scheduler that dies
between creating a job and writing the state finds it again instead of running a second
sample; a job recorded whose message never made the broker is the sweep's to re-send.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import Counter, defaultdict
from typing import Any

from tiergate.jobs.batches.groups import close as close_groups
from tiergate.jobs.batches.metrics import BatchMetrics
from tiergate.jobs.batches.rewards import group_stats, normalize, scored
from tiergate.jobs.batches.schedule import Sample, decide, terminal
from tiergate.jobs.batches.store import BatchStore
from tiergate.jobs.state.lease import Held, Leases, RunLease
from tiergate.jobs.state.lifecycle import JobLifecycle
from tiergate.jobs.state.store import JobStore
from tiergate.protocol import Job, JobMessage
from tiergate.protocol.batches import Batch, BatchCreate, Rollout
from tiergate.queue.pipeline import JobQueue

log = logging.getLogger("tiergate.batches")


def job_id_of(batch_id: str, task: int, sample: int, again: int = 0) -> str:
    """A sample's job id (``again``: how many times the sample was withdrawn as stale
    before: each run of it is a job of its own)."""
    name = f"{batch_id}/{task}/{sample}" + (f"/{again}" if again else "")
    return "job_" + hashlib.sha256(name.encode()).hexdigest()[:32]


def reward_of(job: Job) -> float | None:
    if job.result is None:
        return None
    if job.result.reward is not None:
        return float(job.result.reward)
    return 1.0 if job.result.passed else 0.0


def usage_of(trajectory: bytes | None) -> tuple[int, str | None]:
    """Tokens the rollout's model turns spent, and the tier that served the last one."""
    tokens, tier = 0, None
    for line in (trajectory or b"").decode(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if entry.get("type") == "model":
            usage = entry.get("usage") or {}
            tokens += int(usage.get("total_tokens") or 0)
            tier = entry.get("service_tier") or tier
    return tokens, tier


def summarize(batch: Batch) -> None:
    """Per domain and per task: counts by status, pass rate, reward mean and spread."""
    domains: dict[str, dict[str, Any]] = {}
    by_task: dict[tuple[str, str], list[Rollout]] = defaultdict(list)
    for rollout in batch.rollouts:
        by_task[(rollout.domain, rollout.task_id)].append(rollout)
    for (domain, task_id), members in sorted(by_task.items()):
        entry = domains.setdefault(domain, {"counts": Counter(), "tasks": {}})
        counts = Counter(m.status for m in members)
        entry["counts"].update(counts)
        stats = group_stats(
            [float(m.reward or 0.0) for m in scored(members)],
            sum(1 for m in scored(members) if m.passed),
        )
        entry["tasks"][task_id] = {
            "counts": dict(counts),
            "pass_rate": stats.passed / stats.n if stats.n else None,
            "reward_mean": stats.mean if stats.n else None,
            "reward_std": stats.std if stats.n else None,
        }
    for domain, entry in domains.items():
        members = [r for r in batch.rollouts if r.domain == domain]
        done = scored(members)
        stats = group_stats(
            [float(m.reward or 0.0) for m in done], sum(1 for m in done if m.passed)
        )
        entry["counts"] = dict(entry["counts"])
        entry["pass_rate"] = stats.passed / stats.n if stats.n else None
        entry["reward_mean"] = stats.mean if stats.n else None
        entry["reward_std"] = stats.std if stats.n else None
    batch.domains = domains
    batch.counts = dict(Counter(r.status for r in batch.rollouts))


class BatchDriver:
    """Schedules the batches whose lease this worker holds (one per worker process)."""

    def __init__(
        self,
        store: JobStore,
        queue: JobQueue,
        leases: Leases,
        holder: str,
        default_cap: int,
        metrics: BatchMetrics | None = None,
    ) -> None:
        self._batches = BatchStore(store)
        self._store = store
        self._queue = queue
        self._leases = leases
        self._holder = holder
        self._default_cap = default_cap
        self._jobs = JobLifecycle(store)
        self._held: dict[tuple[str, str], RunLease] = {}
        self._requests: dict[str, BatchCreate] = {}
        self._written: dict[str, bytes] = {}  # batch id -> digest of the state it last wrote
        self._metrics = metrics

    def run_once(self) -> int:
        """One pass over the active batches; returns how many jobs it started."""
        started = 0
        for owner, batch_id in list(self._batches.active()):
            lease = self._held.get((owner, batch_id))
            if lease is None or lease.fenced or lease.released:
                taken = self._leases.take(BatchStore.lease_id(owner, batch_id), self._holder)
                if isinstance(taken, Held):
                    continue
                lease = self._held[(owner, batch_id)] = taken
                self._written.pop(batch_id, None)  # another may have written it since
            started += self._drive(owner, batch_id, lease)
        return started

    def _drive(self, owner: str, batch_id: str, lease: RunLease) -> int:
        spec = self._requests.get(batch_id) or self._batches.request(owner, batch_id)
        batch = self._batches.state(owner, batch_id)
        if spec is None or batch is None:
            return 0
        self._requests[batch_id] = spec
        self._refresh(batch)
        announced = self._batches.announced_policy_version(owner, batch_id)
        if announced is not None and announced > batch.policy_version:
            batch.policy_version = announced
        plan = decide(spec, batch, self._batches.cancel_requested(owner, batch_id), time.time())
        for job_id in plan.cancel:
            job = self._store.get(job_id)
            if job is not None and not job.status.terminal:
                self._jobs.cancel(job)
        room = self._room(owner, batch_id)
        for sample in plan.start[: max(0, room)]:
            batch.rollouts.append(self._start(spec, batch, sample))
        summarize(batch)
        ended = batch.status != "in_progress" and all(terminal(r) for r in batch.rollouts)
        close_groups(spec, batch, time.time())
        if ended and batch.completed_at is None:
            batch.completed_at = int(time.time())
        # Written only when it changed: a batch of many rollouts is one object, and most
        # passes find nothing new.
        body = batch.model_dump_json().encode()
        digest = hashlib.sha256(body).digest()
        if self._written.get(batch_id) != digest:
            lease.check()
            self._batches.put_state(batch, body)
            self._written[batch_id] = digest
        if ended:
            self._batches.finished(owner, batch_id)
            lease.release()
            self._leases.done(lease)
            self._held.pop((owner, batch_id), None)
            self._requests.pop(batch_id, None)
            self._written.pop(batch_id, None)
            log.info("batch %s %s", batch_id, batch.status)
        return min(len(plan.start), max(0, room))

    def release(self) -> None:
        """Hand back every batch this worker schedules (it is stopping): another worker
        takes them at its next pass instead of waiting out the leases."""
        for lease in self._held.values():
            lease.release()
            self._leases.done(lease)
        self._held.clear()
        self._written.clear()

    def _room(self, owner: str, batch_id: str) -> int:
        cap = self._batches.owner_cap(owner, batch_id) or self._default_cap
        return cap - self._store.outstanding(owner, cap)

    def _refresh(self, batch: Batch) -> None:
        """Read the jobs of the rollouts still running; score the batch again when some
        ended (and count their tokens, from their trajectories, once)."""
        changed = False
        for rollout in batch.rollouts:
            if terminal(rollout):
                continue
            job = self._store.get(rollout.job_id)
            if job is None:
                continue
            rollout.status = job.status.value
            rollout.started_at = job.started_at
            if not job.status.terminal:
                continue
            rollout.ended_at = job.completed_at
            changed = True
            if self._metrics is not None:
                self._metrics.ended(rollout.domain, job)
            rollout.passed = job.result.passed if job.result else None
            rollout.reward = reward_of(job)
            rollout.rewards = job.result.rewards if job.result else None
            rollout.error_code = (job.error or {}).get("code")
            rollout.environment_digest = job.environment_digest
            tokens, tier = usage_of(self._store.read_artifact(job.id, "trajectory", job.run))
            rollout.tokens, rollout.service_tier = tokens, tier
            batch.tokens += tokens
        if changed:
            spec = self._requests[batch.id]
            for rollout in batch.rollouts:
                rollout.advantage = rollout.reward_normalized = None
                rollout.normalized_advantage = None
            scores = normalize(batch.rollouts, spec.advantage_clip)
            for rollout in batch.rollouts:
                if rollout.job_id in scores:
                    a, z, n = scores[rollout.job_id]
                    rollout.advantage, rollout.reward_normalized = a, z
                    rollout.normalized_advantage = n

    def _start(self, spec: BatchCreate, batch: Batch, sample: Sample) -> Rollout:
        task = spec.tasks[sample.task]
        job_spec = task.job_spec()
        job_spec.metadata = {
            **job_spec.metadata,
            "batch_id": batch.id,
            "batch_domain": task.domain,
            "batch_task_id": task.task_id,
            "batch_sample": str(sample.sample),
        }
        again = sum(
            1
            for r in batch.stale
            if r.task_id == task.task_id and r.domain == task.domain and r.sample == sample.sample
        )
        job_id = job_id_of(batch.id, sample.task, sample.sample, again)
        job = self._jobs.new_job(job_id, batch.owner, job_spec)
        if self._jobs.create(job, job_spec):
            self._queue.enqueue(JobMessage(id=job_id, owner=batch.owner, spec=job_spec))
        return Rollout(
            job_id=job_id,
            domain=task.domain,
            task_id=task.task_id,
            sample=sample.sample,
            round=sample.round,
            model=task.model,
            policy_version=batch.policy_version,
        )
