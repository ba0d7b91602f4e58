"""``tiergate env build FILE`` and ``tiergate env list``: building needs mmdebstrap and
root (see :mod:`tiergate.envs.build`); registering and listing need the jobs storage
settings (``jobs.storage``), as the workers that fetch the environments have."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from tiergate.envs.build import build
from tiergate.envs.manifest import load_manifest
from tiergate.envs.registry import Registry
from tiergate.jobsettings import JobsSettings
from tiergate.objectstore import ObjectStore


def build_command(
    jobs: JobsSettings, file: Path, upload: bool = True, out: Path | None = None
) -> dict[str, Any]:
    """Build ``file``'s environment (into ``out``, or a temporary file) and, with
    ``upload``, store it and point its name at it; returns what to print."""
    manifest = load_manifest(file)
    with tempfile.TemporaryDirectory(prefix="tiergate-env-") as tmp:
        target = out or Path(tmp) / f"{manifest.name}.tar"
        print(f"building {manifest.name} ({file}) with mmdebstrap ...", file=sys.stderr)
        built = build(manifest, target)
        row: dict[str, Any] = {
            "name": manifest.name,
            "digest": built.digest,
            "bytes": built.bytes,
            "build_seconds": round(built.seconds, 1),
        }
        if out is not None:
            row["path"] = str(out)
        if upload:
            store = ObjectStore(jobs.storage)
            store.ensure_bucket()
            print(f"uploading {built.bytes / 1e6:.0f} MB ...", file=sys.stderr)
            Registry(store).register(built)
            row["registered"] = True
    return row


def list_command(jobs: JobsSettings) -> list[dict[str, Any]]:
    return [
        entry.model_dump(mode="json", exclude={"manifest"})
        | {"packages": entry.manifest.get("packages", [])}
        for entry in Registry(ObjectStore(jobs.storage)).list()
    ]
