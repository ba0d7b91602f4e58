"""The test environment (tiergate.envs): Debian minbase + jq, built by mmdebstrap once and
kept in ``~/.cache/tiergate/envs/test-<manifest digest>.tar`` (the ``built_env`` fixture
in conftest.py), so reruns, and CI when that cache survives, skip the ~30 s build."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from tiergate.envs.build import Built, build, sha256_file
from tiergate.envs.manifest import Manifest

MANIFEST = Manifest(name="test-jq", packages=["jq"], files={"/etc/tiergate-env": "test\n"})


def cached_tar() -> Path:
    return Path.home() / ".cache/tiergate/envs" / f"test-{MANIFEST.digest()}.tar"


def built_test_env() -> Built:
    path = cached_tar()
    if not path.exists():
        return build(MANIFEST, path)
    return Built(MANIFEST, path, sha256_file(path), path.stat().st_size, 0.0)


def cache_dir(owner: int = 0) -> str:
    """A fresh worker cache directory (under /tmp: the sandbox's user must traverse it)."""
    path = Path(f"/tmp/tiergate-envcache/{uuid.uuid4().hex[:10]}")
    path.mkdir(parents=True)
    os.chown(path, owner, owner)
    path.chmod(0o755)
    return str(path)
