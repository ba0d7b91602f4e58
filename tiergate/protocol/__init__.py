"""The wire models of the jobs API, at the ground of the package: the spec a caller
submits, the job every replica, worker and client reads, its status, the Kafka message,
a replay's report, the sandbox's limits and a trajectory's entries.

Nothing here imports anything else of tiergate's (only pydantic and the standard
library), so the gateway, the jobs client, the sandbox, the environment builder and the
worker can all stand on it without loading one another.
"""

from tiergate.protocol.batches import Batch, BatchCreate, BatchTask, Rollout
from tiergate.protocol.jobs import (
    TERMINAL_EVENTS,
    TERMINAL_STATUSES,
    Job,
    JobMessage,
    JobResult,
    JobStatus,
)
from tiergate.protocol.limits import JobLimits, SandboxLimits
from tiergate.protocol.replay import Pair, ReplayReport, ReplayStep, ReplayVerifier
from tiergate.protocol.spec import (
    ENVIRONMENT_PATTERN,
    MAX_WORKSPACE_FILES,
    JobCreate,
    Verifier,
    Workspace,
)
from tiergate.protocol.trajectory import (
    CommandEntry,
    ModelTurn,
    ReplayedCommand,
    SetupEntry,
    TrajectoryEntry,
)

__all__ = [
    "ENVIRONMENT_PATTERN",
    "MAX_WORKSPACE_FILES",
    "TERMINAL_EVENTS",
    "TERMINAL_STATUSES",
    "Batch",
    "BatchCreate",
    "BatchTask",
    "CommandEntry",
    "Job",
    "JobCreate",
    "JobLimits",
    "JobMessage",
    "JobResult",
    "JobStatus",
    "ModelTurn",
    "Pair",
    "ReplayReport",
    "ReplayStep",
    "ReplayVerifier",
    "ReplayedCommand",
    "Rollout",
    "SandboxLimits",
    "SetupEntry",
    "TrajectoryEntry",
    "Verifier",
    "Workspace",
]
