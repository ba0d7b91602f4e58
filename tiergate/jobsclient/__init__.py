"""A small typed client of the jobs API (``/v1/jobs``), sync and async, that the
``tiergate jobs`` command uses. Event streams resume after a dropped connection."""

from tiergate.jobsclient.aio import AsyncJobsClient
from tiergate.jobsclient.errors import (
    JobsAPIError,
    JobsConnectionError,
    JobsError,
    JobsStreamError,
    JobsTimeout,
)
from tiergate.jobsclient.models import Job, JobEvent, JobList
from tiergate.jobsclient.sync import JobsClient
from tiergate.protocol import JobCreate, JobStatus

__all__ = [
    "AsyncJobsClient",
    "Job",
    "JobCreate",
    "JobEvent",
    "JobList",
    "JobStatus",
    "JobsAPIError",
    "JobsClient",
    "JobsConnectionError",
    "JobsError",
    "JobsStreamError",
    "JobsTimeout",
]
