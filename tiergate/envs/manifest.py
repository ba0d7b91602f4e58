"""An environment's manifest: what its root file system is built from.

    name: default
    suite: bookworm
    mirror: http://deb.debian.org/debian
    variant: minbase
    packages: [python3-minimal, jq]
    files:
      /etc/motd: "hello\n"

What it pins and what not: the build is reproducible (``SOURCE_DATE_EPOCH`` fixed, the
extra files added with fixed metadata), so two builds against the same state of the mirror
give the same tar and the same digest. The manifest names packages, not versions: the
Debian mirror moves as Debian publishes (point releases, security updates), and a later
build may get newer packages and so another digest. The digest identifies the content a
job ran in; to pin versions by the manifest alone, name a snapshot mirror
(``http://snapshot.debian.org/archive/debian/20240101T000000Z``).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, Field, field_validator

from tiergate.protocol import ENVIRONMENT_PATTERN

# 2023-11-14T22:13:20Z: any fixed value works; a fixed one makes builds repeatable.
DEFAULT_EPOCH = 1_700_000_000
_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")


class Manifest(BaseModel):
    model_config = {"extra": "forbid"}

    name: str = Field(pattern=ENVIRONMENT_PATTERN)
    suite: str = Field("bookworm", pattern=r"^[a-z0-9-]+$")
    mirror: str = Field("http://deb.debian.org/debian", pattern=r"^https?://\S+$")
    variant: Literal["minbase", "essential", "apt", "required", "important", "standard"] = "minbase"
    packages: list[str] = Field(default_factory=list)
    # Extra files: absolute path in the root -> content (text).
    files: dict[str, str] = Field(default_factory=dict)
    source_date_epoch: int = Field(DEFAULT_EPOCH, ge=0)

    @field_validator("packages")
    @classmethod
    def _packages(cls, value: list[str]) -> list[str]:
        for name in value:
            if not _PACKAGE.match(name):
                raise ValueError(f"{name!r} is not a Debian package name")
        return value

    @field_validator("files")
    @classmethod
    def _files(cls, value: dict[str, str]) -> dict[str, str]:
        for path in value:
            norm = posixpath.normpath(path)
            if not path.startswith("/") or norm != path or norm == "/" or "\0" in path:
                raise ValueError(f"{path!r}: files are named by a normalised absolute path")
        return value

    def digest(self) -> str:
        """The manifest's own digest (what it asks for, not what the build got)."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return hashlib.sha256(canonical).hexdigest()


def load_manifest(path: Path) -> Manifest:
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a manifest is a mapping")
    return Manifest.model_validate(data)
