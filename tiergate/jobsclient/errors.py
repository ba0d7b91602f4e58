"""What the jobs client raises: every error is a :class:`JobsError`."""

from __future__ import annotations

from typing import Any

import httpx


class JobsError(Exception):
    """Base class of the jobs client's errors."""


class JobsAPIError(JobsError):
    """The gateway answered with an error (OpenAI's envelope ``{"error": {...}}``)."""

    def __init__(
        self,
        status: int,
        code: str | None,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(f"{status} {code or 'error'}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.type = type
        self.param = param

    @classmethod
    def from_envelope(cls, status: int, body: Any) -> JobsAPIError | None:
        """The error in ``body``, or None when it is not OpenAI's error envelope."""
        error = body.get("error") if isinstance(body, dict) else None
        if not isinstance(error, dict):
            return None
        return cls(
            status,
            error.get("code"),
            str(error.get("message") or ""),
            type=error.get("type"),
            param=error.get("param"),
        )

    @classmethod
    def from_response(cls, response: httpx.Response) -> JobsAPIError:
        """Build the error from a (read) error response, enveloped or not."""
        try:
            found = cls.from_envelope(response.status_code, response.json())
        except ValueError:
            found = None
        if found is not None:
            return found
        text = response.text.strip()[:300] or response.reason_phrase
        return cls(response.status_code, None, text)


class JobsConnectionError(JobsError):
    """The gateway could not be reached, or the connection broke."""


class JobsStreamError(JobsError):
    """A job's event stream kept breaking: the client gave up reconnecting."""


class JobsTimeout(JobsError, TimeoutError):
    """:meth:`wait` ran out of time before the job finished (the job goes on)."""

    def __init__(self, job_id: str, timeout: float, status: str | None) -> None:
        last = f"; last status seen: {status}" if status else ""
        super().__init__(f"job {job_id} did not finish within {timeout:g} s{last}")
        self.job_id = job_id
        self.timeout = timeout
        self.status = status
