"""A name kept pointing at a build of one manifest: built and registered the first time,
reused afterwards while the registration was built from that same manifest, built again
when the manifest changed (what ``tiergate up`` does for ``default``).

Reuse is decided by the manifest's own digest (:meth:`Manifest.digest`), not by building
and comparing: the build is what takes the time. The manifest names packages, not
versions, so a reused environment keeps the packages of the day it was built; building it
again by hand (``tiergate env build``) points the name at a newer build, which is then the
one reused.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from tiergate.envs.build import Built, build
from tiergate.envs.manifest import Manifest
from tiergate.envs.registry import Registered, Registry

Builder = Callable[[Manifest, Path], Built]


@dataclass(frozen=True, slots=True)
class Ensured:
    """The registration the name points at, and whether this call built it."""

    entry: Registered
    built: bool


def built_from(entry: Registered, manifest: Manifest) -> bool:
    """Whether ``entry`` was built from ``manifest``.

    The registration already holds the manifest it was built from, written in the same put
    as the digest it points at, so this needs no marker of its own that could disagree with
    the name (after a ``tiergate env build`` beside it, say). The stored manifest is read
    back through :class:`Manifest` before its digest is taken, so a field added to manifests
    later, with its default, does not count as a change; one that no longer validates does.
    """
    try:
        return Manifest.model_validate(entry.manifest).digest() == manifest.digest()
    except ValidationError:
        return False


def ensure_registered(
    registry: Registry,
    manifest: Manifest,
    say: Callable[[str], None],
    builder: Builder = build,
    work_dir: Path | None = None,
) -> Ensured:
    """Point ``manifest.name`` at a build of ``manifest``: the registered one when it was
    built from this manifest and its blob is stored, else a new build (in a temporary
    directory under ``work_dir``), uploaded and registered. Raises what the builder raises
    (:class:`~tiergate.envs.build.BuildError`) and
    :class:`~tiergate.objectstore.StorageError`."""
    entry = registry.resolve(manifest.name)
    if entry is None:
        why = "none is registered"
    elif not built_from(entry, manifest):
        why = f"the registered one ({entry.digest[:12]}) was built from another manifest"
    elif not registry.has_blob(entry.digest):
        why = f"the registered one ({entry.digest[:12]}) is no longer stored"
    else:
        return Ensured(entry, built=False)
    say(f"building {manifest.name} with mmdebstrap ({why})")
    if work_dir is not None:
        work_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tiergate-env-", dir=work_dir) as tmp:
        built = builder(manifest, Path(tmp) / f"{manifest.name}.tar")
        say(
            f"built {manifest.name} in {built.seconds:.0f} s: {built.digest[:12]} "
            f"({built.bytes / 1e6:.0f} MB); storing it"
        )
        return Ensured(registry.register(built), built=True)
