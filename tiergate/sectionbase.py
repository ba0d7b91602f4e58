"""The base of every settings section: unknown keys are errors, so a typo is reported."""

from __future__ import annotations

from pydantic import BaseModel


class Section(BaseModel):
    model_config = {"extra": "forbid"}
