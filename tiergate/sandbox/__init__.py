"""The job sandbox: every command of a job runs under bubblewrap with no network, a private
``/tmp``, read-only ``/usr``, the job's workspace at ``/workspace``, and limits.

A package of its own (not part of the queue) so that anything running untrusted code (the
job runner, the quantization parity check) can use it; it imports only settings and the
wire models of its limits (:class:`~tiergate.protocol.SandboxLimits`).
"""

from __future__ import annotations

from tiergate.sandbox.capture import truncate
from tiergate.sandbox.errors import LimitsUnavailable, SandboxError
from tiergate.sandbox.limits import probe_limits
from tiergate.sandbox.sandbox import CommandResult, Sandbox

__all__ = [
    "CommandResult",
    "LimitsUnavailable",
    "Sandbox",
    "SandboxError",
    "probe_limits",
    "truncate",
]
