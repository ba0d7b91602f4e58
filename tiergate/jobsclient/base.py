"""What the sync and async clients share: settings, request bodies, answers, and how an
event stream is followed across reconnects (:class:`Follow`)."""

from __future__ import annotations

import io
import json
import os
import tarfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

from tiergate import __version__
from tiergate.jobsclient.errors import JobsAPIError, JobsStreamError
from tiergate.jobsclient.models import JobEvent
from tiergate.protocol import JobCreate

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
BASE_URL_ENV = "TIERGATE_BASE_URL"
API_KEY_ENV = "TIERGATE_API_KEY"
# The gateway sends a keep-alive on an idle event stream every 15 s: a stream silent for
# longer than this is broken, and is resumed.
STREAM_READ_SECONDS = 45.0
# Statuses worth reconnecting after (the gateway names a retry-after on its 503s).
RETRYABLE = frozenset({408, 429, 500, 502, 503, 504})

WorkspaceSource = str | os.PathLike[str] | bytes
# A batch's tasks to upload: a JSON-lines file, its bytes, or the tasks themselves.
TasksSource = str | Path | bytes | Iterable[Mapping[str, Any]]


@dataclass(frozen=True)
class Options:
    base_url: str
    headers: dict[str, str]
    timeout: float
    max_stream_retries: int
    backoff_seconds: float
    max_backoff_seconds: float


def options(
    base_url: str | None,
    api_key: str | None,
    timeout: float,
    max_stream_retries: int,
    backoff_seconds: float,
    max_backoff_seconds: float,
) -> Options:
    """``base_url`` defaults to ``$TIERGATE_BASE_URL``, else http://127.0.0.1:8000 (a
    trailing ``/v1``, as OpenAI clients take it, is accepted); ``api_key`` to
    ``$TIERGATE_API_KEY`` (none: no authorization header)."""
    base = (base_url or os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL).rstrip("/")
    base = base.removesuffix("/v1")
    key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
    headers = {"user-agent": f"tiergate-jobs/{__version__}"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    return Options(base, headers, timeout, max_stream_retries, backoff_seconds, max_backoff_seconds)


def job_body(job: Mapping[str, Any] | JobCreate) -> dict[str, Any]:
    """The JSON body of ``POST /v1/jobs``; a mapping is sent as it is (the gateway
    validates it and says what is wrong)."""
    if isinstance(job, JobCreate):
        return job.model_dump(mode="json", exclude_unset=True)
    return dict(job)


def idempotency_headers(key: str | None) -> dict[str, str]:
    return {"idempotency-key": key} if key else {}


def workspace_bytes(source: WorkspaceSource) -> bytes:
    """An upload's body: bytes as they are, a file's contents (a tar or tar.gz archive),
    or a directory packed as tar.gz with its contents at the workspace's top."""
    if isinstance(source, bytes):
        return source
    path = Path(source)
    if not path.is_dir():
        return path.read_bytes()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for child in sorted(path.iterdir()):
            tar.add(child, arcname=child.name)
    return buffer.getvalue()


def tasks_bytes(source: TasksSource) -> bytes:
    """A tasks file's body: bytes as they are, a JSON-lines file's contents, or tasks
    (mappings) written one a line."""
    if isinstance(source, bytes):
        return source
    if isinstance(source, (str, Path)):
        return Path(source).read_bytes()
    return b"".join(json.dumps(dict(task)).encode() + b"\n" for task in source)


def check(response: httpx.Response) -> httpx.Response:
    """The response, or :class:`JobsAPIError` when it is an error (read it first)."""
    if response.is_error:
        raise JobsAPIError.from_response(response)
    return response


def retry_after(response: httpx.Response) -> float | None:
    try:
        return float(response.headers["retry-after"])
    except (KeyError, ValueError):
        return None


class Reconnect(Exception):
    """The stream broke, or the gateway asked to come back later: resume it."""

    def __init__(self, cause: Exception, after: float | None = None) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.after = after


class Follow:
    """Where a job's event stream is, across connections.

    Each event is handed on once, in order: after a dropped connection the stream is
    opened again with ``starting_after`` = the last sequence number handed on, and an
    event at or before it is skipped. The stream is over after the job's terminal event
    (or the gateway's ``[DONE]``). Reconnects back off exponentially up to
    ``max_backoff_seconds``; after ``max_retries`` in a row with no new event in between,
    :class:`JobsStreamError`. With a ``deadline`` (time.monotonic), :class:`Expired` when
    it passes."""

    def __init__(self, job_id: str, starting_after: int, opts: Options, deadline: float | None):
        self.job_id = job_id
        self.last = max(starting_after, 0)
        self.done = False
        self.failures = 0
        self.deadline = deadline
        self._opts = opts

    @property
    def path(self) -> str:
        return f"/v1/jobs/{self.job_id}/events"

    def params(self) -> dict[str, int]:
        return {"starting_after": self.last}

    def remaining(self) -> float | None:
        if self.deadline is None:
            return None
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise Expired
        return left

    def timeout(self) -> httpx.Timeout:
        left = self.remaining()
        cap = float("inf") if left is None else left
        request = min(self._opts.timeout, cap)
        return httpx.Timeout(request, read=min(STREAM_READ_SECONDS, cap))

    def opened(self, response: httpx.Response) -> None:
        """Check a (read) non-200 answer: a transient one is a :class:`Reconnect`."""
        error = JobsAPIError.from_response(response)
        if response.status_code in RETRYABLE:
            raise Reconnect(error, retry_after(response))
        raise error

    def take(self, data: str) -> JobEvent | None:
        """One SSE ``data`` field: the event to hand on, or None (a repeat, or the end)."""
        if data == "[DONE]":
            self.done = True
            return None
        payload = orjson.loads(data)
        if "sequence_number" not in payload:
            # The gateway lost its store mid-stream: it says so and closes the stream.
            error = JobsAPIError.from_envelope(503, payload)
            raise Reconnect(error or JobsStreamError(f"unexpected event: {data[:200]}"))
        event = JobEvent.model_validate(payload)
        if event.sequence_number <= self.last:
            return None
        self.last = event.sequence_number
        self.failures = 0
        self.done = event.terminal
        return event

    def ended(self) -> Reconnect:
        """The stream closed before the job's end."""
        return Reconnect(JobsStreamError("the event stream ended before the job did"))

    def backoff(self, exc: Exception) -> float:
        """Seconds to wait before reconnecting after ``exc``; gives up past the limit."""
        cause = exc.cause if isinstance(exc, Reconnect) else exc
        self.failures += 1
        if self.failures > self._opts.max_stream_retries:
            raise JobsStreamError(
                f"the events of job {self.job_id} broke off {self.failures} times in a row "
                f"(last: {cause}); resume with starting_after={self.last}"
            ) from cause
        delay = self._opts.backoff_seconds * 2.0 ** (self.failures - 1)
        if isinstance(exc, Reconnect) and exc.after:
            delay = max(delay, exc.after)
        delay = min(delay, self._opts.max_backoff_seconds)
        left = self.remaining()
        return delay if left is None else min(delay, left)


class Expired(Exception):
    """A :class:`Follow`'s deadline passed (the client turns it into :class:`JobsTimeout`)."""
