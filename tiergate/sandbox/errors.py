"""The sandbox's exceptions, apart so every module of the package can raise them."""

from __future__ import annotations


class SandboxError(Exception):
    """The sandbox itself failed (not the command in it): the job fails, not the step."""


class LimitsUnavailable(SandboxError):
    """No cgroup for memory, CPU and process limits can be made here.

    A subclass of :class:`SandboxError` so that a job that meets it fails like any other
    sandbox failure; the worker checks for it once at start (``probe_limits``) to refuse to
    run at all instead of failing every job.
    """

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message  # what was tried and why it failed, without advice


class SeccompUnavailable(LimitsUnavailable):
    """The system-call filter cannot be built here (libseccomp or its binding missing).

    A :class:`LimitsUnavailable`, so the worker refuses to start on it the same way (unless
    ``allow_no_seccomp``), and a job that meets it fails as a sandbox failure.
    """
