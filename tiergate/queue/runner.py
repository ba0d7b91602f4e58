"""Running one job, start to finish: workspace, setup, the agent loop, the verifier, the
artifacts, and the terminal record written exactly once.

Redelivery is normal: a job whose terminal record exists is not run again. Transient
failures (model endpoint down, object storage errors) send the job to the retry topic with
backoff; a job that keeps failing ends ``failed`` and goes to the dead-letter topic.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from tiergate.queue.agent import AgentLoop, ModelClient, ModelRefused, ModelUnavailable
from tiergate.queue.pipeline import JobQueue, QueueUnavailable
from tiergate.queue.sandbox import Sandbox, SandboxError
from tiergate.queue.schema import Job, JobMessage, JobResult, JobStatus
from tiergate.queue.store import JobStore, StorageError
from tiergate.settings import JobsSettings

log = logging.getLogger("tiergate.worker")

Outcome = Literal["finished", "skipped", "retry", "dead", "abandoned"]


class Abandoned(Exception):
    """The worker is shutting down before the job finished; it will be redelivered."""


@dataclass
class _Events:
    store: JobStore
    job_id: str
    sequence: int

    def emit(self, kind: str, **data: Any) -> None:
        self.sequence += 1
        self.store.append_event(
            self.job_id, self.sequence, {"type": kind, "created_at": int(time.time()), **data}
        )


class JobRunner:
    """Runs jobs for one worker thread; ``abandon()`` may be called from another thread."""

    def __init__(
        self,
        settings: JobsSettings,
        store: JobStore,
        queue: JobQueue,
        model_client: Callable[[JobMessage], ModelClient] | None = None,
    ) -> None:
        self._settings = settings
        self._store = store
        self._queue = queue
        self._model_client = model_client or self._default_client
        self._abandon = threading.Event()
        self._sandbox: Sandbox | None = None

    def _default_client(self, message: JobMessage) -> ModelClient:
        return ModelClient(
            self._settings.gateway_url,
            message.spec.model,
            message.spec.service_tier,
            self._settings.worker.api_key,
        )

    def abandon(self) -> None:
        self._abandon.set()
        if self._sandbox is not None:
            self._sandbox.kill()

    # -- the job ----------------------------------------------------------------------------

    def process(self, message: JobMessage) -> Outcome:
        final = self._store.final(message.id)
        if final is not None:
            # A worker may have died between the terminal record and its event: the event
            # stream must still end, so the event is written now.
            self._ensure_terminal_event(final)
            log.info("job %s already finished; redelivery skipped", message.id)
            return "skipped"
        job = self._store.get(message.id) or Job(
            id=message.id,
            owner=message.owner,
            status=JobStatus.QUEUED,
            model=message.spec.model,
            service_tier=message.spec.service_tier,
            created_at=int(time.time()),
            metadata=message.spec.metadata,
        )
        events = _Events(self._store, job.id, self._store.last_sequence(job.id))
        if self._store.cancel_requested(job.id):
            self._finish(job, events, JobStatus.CANCELLED)
            return "finished"
        job.status = JobStatus.IN_PROGRESS
        job.started_at = int(time.time())
        job.attempts = message.attempt
        job.error = None
        self._store.put_status(job)
        events.emit("job.in_progress", status=job.status.value, attempt=message.attempt)
        try:
            return self._run(job, message, events)
        except Abandoned:
            return "abandoned"
        except (ModelUnavailable, StorageError) as exc:
            return self._transient(job, message, events, exc)
        except (ModelRefused, SandboxError) as exc:
            reason = "sandbox" if isinstance(exc, SandboxError) else "model_refused"
            job.error = {"code": reason, "message": str(exc)}
            self._finish(job, events, JobStatus.FAILED)
            self._dead_letter(message)
            return "dead"

    def _run(self, job: Job, message: JobMessage, events: _Events) -> Outcome:
        spec = message.spec
        deadline = time.monotonic() + spec.limits.timeout_seconds
        sandbox = Sandbox(job.id, spec.limits, self._settings.sandbox)
        self._sandbox = sandbox
        cancelled = threading.Event()
        stop_watch = threading.Event()
        watcher = threading.Thread(
            target=self._watch_cancel, args=(job.id, sandbox, cancelled, stop_watch), daemon=True
        )
        watcher.start()
        trajectory: list[dict[str, Any]] = []
        model = self._model_client(message)
        try:
            if spec.workspace.url:
                sandbox.extract(self._store.read_object(spec.workspace.url))
            sandbox.write_files(spec.workspace.files or {})
            for command in spec.setup:
                result = sandbox.run(command, timeout=max(1.0, deadline - time.monotonic()))
                trajectory.append(
                    {
                        "type": "setup",
                        "command": command,
                        "exit_code": result.exit_code,
                        "output": result.output,
                    }
                )
                self._check_abandon()
                if result.exit_code != 0:
                    raise SandboxError(f"setup command failed ({result.exit_code}): {command}")

            def on_step(entry: dict[str, Any]) -> None:
                job.steps = entry["step"]
                self._store.put_status(job)
                events.emit(
                    "job.step",
                    step=entry["step"],
                    command=entry["command"],
                    exit_code=entry["exit_code"],
                    output=entry["output"],
                )
                used = sandbox.workspace_bytes()
                if used > spec.limits.disk_mb * 1024 * 1024:
                    raise SandboxError(
                        f"the workspace grew to {used} bytes, over disk_mb={spec.limits.disk_mb}"
                    )

            loop = AgentLoop(
                model=model,
                sandbox=sandbox,
                instruction=spec.instruction,
                max_steps=spec.limits.max_steps,
                deadline=deadline,
                protocol=self._settings.worker.protocol,
                cancelled=cancelled.is_set,
                on_step=on_step,
            )
            run = loop.run()
            trajectory += run.trajectory
            job.steps = run.steps
            self._check_abandon()
            if run.stop == "cancelled" or cancelled.is_set():
                self._store_artifacts(job, sandbox, trajectory, None)
                self._finish(job, events, JobStatus.CANCELLED)
                return "finished"
            verifier_log = None
            if spec.verifier is not None:
                result = sandbox.run(spec.verifier.command, spec.verifier.timeout_seconds)
                verifier_log = result.output
                reward = _read_reward(sandbox, spec.verifier.reward_file)
                job.result = JobResult(
                    passed=result.exit_code == 0 and (reward is None or reward > 0),
                    reward=reward,
                    verifier_exit_code=result.exit_code,
                )
                events.emit("job.verified", exit_code=result.exit_code, reward=reward)
            self._check_abandon()
            self._store_artifacts(job, sandbox, trajectory, verifier_log)
            if run.stop in ("max_steps", "timeout"):
                job.incomplete_details = {"reason": run.stop}
                self._finish(job, events, JobStatus.INCOMPLETE)
            else:
                self._finish(job, events, JobStatus.COMPLETED)
            return "finished"
        finally:
            stop_watch.set()
            model.close()
            sandbox.close()
            self._sandbox = None

    def _check_abandon(self) -> None:
        if self._abandon.is_set():
            raise Abandoned

    def _watch_cancel(
        self, job_id: str, sandbox: Sandbox, cancelled: threading.Event, stop: threading.Event
    ) -> None:
        while not stop.wait(self._settings.worker.cancel_poll_seconds):
            try:
                if self._store.cancel_requested(job_id):
                    cancelled.set()
                    sandbox.kill()
                    return
            except StorageError:
                continue

    def _store_artifacts(
        self, job: Job, sandbox: Sandbox, trajectory: list[dict[str, Any]], verifier_log: str | None
    ) -> None:
        lines = "".join(json.dumps(entry, default=str) + "\n" for entry in trajectory)
        self._store.put_artifact(job.id, "trajectory", lines.encode())
        if verifier_log is not None:
            self._store.put_artifact(job.id, "verifier_log", verifier_log.encode())
        self._store.put_artifact(job.id, "workspace", sandbox.archive())

    def _finish(self, job: Job, events: _Events, status: JobStatus) -> None:
        job.status = status
        job.completed_at = int(time.time())
        if self._store.finalize(job):
            events.emit(
                f"job.{status.value}",
                status=status.value,
                job=job.model_dump(mode="json", exclude={"owner"}),
            )
        else:
            log.info("job %s: terminal record already written by another writer", job.id)

    def _ensure_terminal_event(self, job: Job) -> None:
        kind = f"job.{job.status.value}"
        if any(e["type"] == kind for e in self._store.events(job.id, 0)):
            return
        events = _Events(self._store, job.id, self._store.last_sequence(job.id))
        events.emit(
            kind, status=job.status.value, job=job.model_dump(mode="json", exclude={"owner"})
        )

    # -- failure ----------------------------------------------------------------------------

    def _transient(self, job: Job, message: JobMessage, events: _Events, exc: Exception) -> Outcome:
        worker = self._settings.worker
        log.warning("job %s attempt %d failed: %s", job.id, message.attempt, exc)
        if message.attempt < worker.max_attempts:
            delay = worker.retry_backoff_seconds * 2 ** (message.attempt - 1)
            retry = message.model_copy(
                update={"attempt": message.attempt + 1, "not_before": time.time() + delay}
            )
            try:
                self._queue.retry_later(retry)
                job.status = JobStatus.QUEUED
                job.error = {"code": "retrying", "message": str(exc)}
                self._store.put_status(job)
                events.emit(
                    "job.retrying", attempt=message.attempt, delay_seconds=delay, error=str(exc)
                )
                return "retry"
            except (QueueUnavailable, StorageError) as again:
                log.error("job %s could not be scheduled for retry: %s", job.id, again)
                raise
        job.error = {
            "code": "transient_failures",
            "message": f"gave up after {message.attempt} attempts: {exc}",
        }
        self._finish(job, events, JobStatus.FAILED)
        self._dead_letter(message)
        return "dead"

    def _dead_letter(self, message: JobMessage) -> None:
        try:
            self._queue.dead_letter(message)
        except QueueUnavailable as exc:
            log.error("job %s: dead-letter topic unavailable: %s", message.id, exc)


def _read_reward(sandbox: Sandbox, name: str | None) -> float | None:
    if not name:
        return None
    path = (sandbox.workspace / name).resolve()
    if not path.is_relative_to(sandbox.workspace.resolve()) or not path.is_file():
        return None
    try:
        return float(path.read_text().strip().split()[0])
    except (ValueError, IndexError):
        return None
