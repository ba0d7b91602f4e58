"""The report a replay job answers with (``job.replay``): per recorded command, whether
it behaved as recorded. The docstrings of these models are published in the OpenAPI
description, so they are part of the wire format."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class Pair(BaseModel):
    """One quantity as the original job recorded it and as its replay saw it."""

    recorded: Any = None
    replayed: Any = None


class ReplayStep(BaseModel):
    """One recorded command run again. ``index`` is the original's step number (setup
    commands count from 1 in their own list). Outputs are compared in the form the sandbox
    captured them (bounded head and tail, ``jobs.sandbox.output_limit_chars``); both
    outputs are kept only when they differ."""

    index: int
    command: str
    exit_code: Pair
    exit_matches: bool
    output_matches: bool
    seconds: Pair = Field(default_factory=Pair)
    output: Pair | None = None


class ReplayVerifier(BaseModel):
    command: str
    exit_code: Pair
    reward: Pair
    passed: Pair
    exit_matches: bool
    output_matches: bool
    matches: bool


class ReplayReport(BaseModel):
    """A replay job's answer (``job.replay``): per step whether the exit status and the
    output match the original's trajectory; ``matches`` only if every setup command, step
    and the verifier match. ``environment`` is the original's environment identity
    ("default" where jobs name none)."""

    original: str
    environment: str = "default"
    # The digest of the environment the original (and so the replay) ran in; None: the
    # worker's own system.
    environment_digest: str | None = None
    setup: list[ReplayStep] = Field(default_factory=list)
    steps: list[ReplayStep] = Field(default_factory=list)
    verifier: ReplayVerifier | None = None
    matches: bool = False
