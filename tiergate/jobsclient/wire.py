"""What the sync and async clients send and how they read the answers, apart from the
transport: each API call is a :class:`Call` (its method, path, params, body and headers,
and how its answer becomes a model or a :class:`JobsAPIError`); :class:`Client` holds the
settings and the HTTP client (``httpx.Client`` or ``httpx.AsyncClient``), and each client
only sends the calls and reads the event streams on it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx

from tiergate.jobsclient.base import Follow, Options, check, idempotency_headers, job_body
from tiergate.jobsclient.base import options as make_options
from tiergate.jobsclient.errors import JobsConnectionError, JobsTimeout
from tiergate.jobsclient.models import Batch, Job, JobEvent, JobList
from tiergate.protocol import JobCreate

T = TypeVar("T")
H = TypeVar("H", httpx.Client, httpx.AsyncClient)


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request of the jobs API, and ``read``: its (successful) answer as a model."""

    method: str
    path: str
    read: Callable[[httpx.Response], T]
    params: dict[str, Any] | None = None
    json: Any = None
    content: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def request(self, opts: Options) -> dict[str, Any]:
        """The keyword arguments of ``request`` on ``httpx.Client`` or ``AsyncClient``."""
        given = {"params": self.params, "json": self.json, "content": self.content}
        return {
            "method": self.method,
            "url": opts.base_url + self.path,
            "headers": {**opts.headers, **self.headers},
            **{name: value for name, value in given.items() if value is not None},
        }

    def unreachable(self, opts: Options, exc: httpx.TransportError) -> JobsConnectionError:
        """The error for a request that got no answer."""
        return JobsConnectionError(
            f"{self.method} {opts.base_url}{self.path}: {type(exc).__name__}: {exc}"
        )

    def answer(self, response: httpx.Response) -> T:
        """The answer's model, or :class:`JobsAPIError` when it is an error."""
        return self.read(check(response))


def _job(response: httpx.Response) -> Job:
    return Job.model_validate_json(response.content)


def _job_list(response: httpx.Response) -> JobList:
    return JobList.model_validate_json(response.content)


def _upload_id(response: httpx.Response) -> str:
    upload_id: str = response.json()["id"]
    return upload_id


def submit(job: Mapping[str, Any] | JobCreate, idempotency_key: str | None) -> Call[Job]:
    return Call(
        "POST",
        "/v1/jobs",
        _job,
        json=job_body(job),
        headers=idempotency_headers(idempotency_key),
    )


def _upload(path: str, body: bytes, content_type: str) -> Call[str]:
    return Call("POST", path, _upload_id, content=body, headers={"content-type": content_type})


def upload(body: bytes) -> Call[str]:
    return _upload("/v1/jobs/workspaces", body, "application/octet-stream")


def get(job_id: str) -> Call[Job]:
    return Call("GET", f"/v1/jobs/{job_id}", _job)


def list_jobs(after: str | None, limit: int) -> Call[JobList]:
    params: dict[str, Any] = {"limit": limit}
    if after:
        params["after"] = after
    return Call("GET", "/v1/jobs", _job_list, params=params)


def cancel(job_id: str) -> Call[Job]:
    return Call("POST", f"/v1/jobs/{job_id}/cancel", _job)


def replay(job_id: str) -> Call[Job]:
    return Call("POST", f"/v1/jobs/{job_id}/replay", _job)


def _batch(response: httpx.Response) -> Batch:
    return Batch.model_validate_json(response.content)


def _lines(response: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line) for line in response.text.splitlines() if line.strip()]


def upload_tasks(body: bytes) -> Call[str]:
    return _upload("/v1/jobs/batches/tasks", body, "application/jsonl")


def batch_body(
    tasks: Iterable[Mapping[str, Any]] | None,
    samples_per_task: int,
    tasks_upload_id: str | None,
    options: Mapping[str, Any],
) -> dict[str, Any]:
    given: dict[str, Any] = {"tasks_upload_id": tasks_upload_id} if tasks_upload_id else {}
    if tasks is not None:
        given["tasks"] = list(tasks)
    return {**given, "samples_per_task": samples_per_task, **options}


def submit_batch(body: Mapping[str, Any]) -> Call[Batch]:
    return Call("POST", "/v1/jobs/batches", _batch, json=dict(body))


def get_batch(batch_id: str) -> Call[Batch]:
    return Call("GET", f"/v1/jobs/batches/{batch_id}", _batch)


def cancel_batch(batch_id: str) -> Call[Batch]:
    return Call("POST", f"/v1/jobs/batches/{batch_id}/cancel", _batch)


def batch_rollouts(batch_id: str) -> Call[list[dict[str, Any]]]:
    return Call("GET", f"/v1/jobs/batches/{batch_id}/rollouts", _lines)


@dataclass(frozen=True)
class GroupPage:
    """A page of a batch's complete groups, and whether the batch had ended when it was
    read (then a page with nothing new is the last)."""

    groups: list[dict[str, Any]]
    ended: bool


def _group_page(response: httpx.Response) -> GroupPage:
    status = response.headers.get("x-tiergate-batch-status", "in_progress")
    return GroupPage(_lines(response), status != "in_progress")


GROUP_PAGE = 100


def batch_groups(batch_id: str, starting_after: int) -> Call[GroupPage]:
    params = {"starting_after": starting_after, "limit": GROUP_PAGE}
    return Call("GET", f"/v1/jobs/batches/{batch_id}/groups", _group_page, params=params)


def stream(opts: Options, follow: Follow) -> dict[str, Any]:
    """The arguments (after the HTTP client) of ``connect_sse`` or ``aconnect_sse`` for the
    next connection of ``follow``'s event stream."""
    return {
        "method": "GET",
        "url": opts.base_url + follow.path,
        "params": follow.params(),
        "headers": dict(opts.headers),
        "timeout": follow.timeout(),
    }


def take(follow: Follow, data: str) -> list[JobEvent]:
    """The events to hand on for one SSE ``data`` field of ``follow``'s stream: none (a
    repeat, or the end) or one."""
    event = follow.take(data)
    return [] if event is None else [event]


def over(follow: Follow) -> bool:
    """After an event of the stream: whether it is over; :class:`Expired` past the
    deadline."""
    if follow.done:
        return True
    follow.remaining()
    return False


class Wait(Follow):
    """:class:`Follow` for ``wait``: from the job's first event, until ``timeout`` seconds
    from now, noting the last status seen for :meth:`expired`."""

    def __init__(self, job_id: str, timeout: float | None, opts: Options) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        super().__init__(job_id, 0, opts, deadline)
        self.seconds = timeout
        self.status: str | None = None

    def take(self, data: str) -> JobEvent | None:
        event = super().take(data)
        if event is not None:
            self.status = event.status or self.status
        return event

    def expired(self) -> JobsTimeout:
        return JobsTimeout(self.job_id, self.seconds or 0.0, self.status)


class Client(Generic[H]):
    """The settings and the HTTP client (``http_client``, else one of ``_transport`` made
    here and closed with the client) that :class:`JobsClient` and
    :class:`AsyncJobsClient` share."""

    _transport: type[H]

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 30.0,
        *,
        max_stream_retries: int = 8,
        backoff_seconds: float = 0.5,
        max_backoff_seconds: float = 8.0,
        http_client: H | None = None,
    ) -> None:
        self._opts = make_options(
            base_url, api_key, timeout, max_stream_retries, backoff_seconds, max_backoff_seconds
        )
        self._http: H = http_client or self._transport(timeout=timeout)
        self._own_http = http_client is None

    @property
    def base_url(self) -> str:
        return self._opts.base_url
