"""The entries of a job's trajectory (the ``trajectory`` artifact, one JSON object a line):
what the worker writes and what a replay reads back.

Typed dicts rather than models: an entry is written with ``json.dumps`` in the order its
keys are given, and read back from older jobs as it was stored, so the types describe the
lines without changing a byte of them.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict


class ModelTurn(TypedDict):
    """One answer of the model: its text and tool calls, its usage and the tier it ran on."""

    type: Literal["model"]
    content: str
    tool_calls: Any
    seconds: float
    usage: Any
    service_tier: Any
    ts: float


class SetupEntry(TypedDict):
    """One of the spec's setup commands, run before the agent starts."""

    type: Literal["setup"]
    command: str
    exit_code: int
    output: str


class CommandEntry(TypedDict):
    """One step: a command the agent ran in the sandbox (``step`` counts from 1); also the
    body of a ``job.step`` event."""

    type: Literal["command"]
    step: int
    command: str
    exit_code: int
    output: str
    seconds: float
    timed_out: bool
    ts: float


class ReplayedCommand(CommandEntry):
    """A recorded step run again by a replay, with whether it behaved as recorded."""

    exit_matches: bool
    output_matches: bool


TrajectoryEntry = ModelTurn | SetupEntry | CommandEntry
