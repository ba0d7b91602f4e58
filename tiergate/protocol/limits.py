"""The limits a sandbox enforces, owned here so that the sandbox needs no job package.

The sandbox reads :class:`SandboxLimits`; a job carries them as ``limits``
(:class:`JobLimits`, the same fields under the name the jobs API has always published).
"""

from __future__ import annotations

from pydantic import Field

from tiergate.protocol.base import Strict


class SandboxLimits(Strict):
    """What one job's sandbox may use: steps, wall time, CPUs, memory and disk."""

    max_steps: int = Field(20, ge=1, le=500)
    timeout_seconds: float = Field(600.0, gt=0, le=6 * 3600)
    cpus: float = Field(1.0, gt=0, le=64)
    memory_mb: int = Field(1024, ge=16, le=256 * 1024)
    disk_mb: int = Field(1024, ge=1, le=1024 * 1024)


# A subclass, not an alias, so the published schema keeps its name ("JobLimits"); no
# docstring, because pydantic would publish it as the schema's description.
class JobLimits(SandboxLimits):
    pass
