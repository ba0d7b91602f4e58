"""The local stack's default job environment: the shipped manifest
(``environments/default.yaml``) built with mmdebstrap and registered as ``default`` in the
stack's object store before the worker starts, then unpacked into the worker's cache, so
that a job naming no environment runs in it and records its digest. Built once: later
starts reuse the registration while it was built from the same manifest
(:func:`tiergate.envs.ensure.built_from`).

A failure stops ``tiergate up`` with the reason: falling back to the worker's own system
would make jobs quietly unreproducible, which is what building it is for. Leaving it out
is an explicit choice (``tiergate up --no-default-environment``).
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from pathlib import Path

import yaml

from tiergate.envs.build import BuildError, build
from tiergate.envs.cache import EnvCache
from tiergate.envs.ensure import Builder, ensure_registered
from tiergate.envs.manifest import load_manifest
from tiergate.envs.registry import Registered, Registry
from tiergate.jobsettings import JobsSettings
from tiergate.objectstore import ObjectStore, StorageError
from tiergate.sandbox.errors import SandboxError

# The repository's own manifest (``tiergate up`` runs from a checkout: ``make up``).
SHIPPED_MANIFEST = Path(__file__).resolve().parents[2] / "environments" / "default.yaml"
NAME = "default"
_OPT_OUT = "tiergate up --no-default-environment runs jobs in the worker's own system instead"


class DefaultEnvironmentFailed(RuntimeError):
    """The default environment could not be built, stored or unpacked."""


def ensure_default_environment(
    jobs: JobsSettings,
    manifest_path: Path,
    say: Callable[[str], None],
    builder: Builder = build,
    *,
    work_dir: Path,
) -> Registered:
    """Register ``manifest_path``'s environment as ``default`` in ``jobs.storage`` (built
    unless the registered one was built from this manifest) and unpack it into
    ``jobs.sandbox.cache_dir`` (a build works in ``work_dir``); mmdebstrap's progress goes to
    stderr. Raises
    :class:`DefaultEnvironmentFailed` with the reason."""
    try:
        manifest = load_manifest(manifest_path)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise DefaultEnvironmentFailed(
            f"the default environment's manifest {manifest_path} cannot be read: {exc} ({_OPT_OUT})"
        ) from exc
    if manifest.name != NAME:
        raise DefaultEnvironmentFailed(
            f"{manifest_path} names {manifest.name!r}; the default environment's manifest "
            f"names {NAME!r}"
        )
    registry = Registry(ObjectStore(jobs.storage))
    try:
        ensured = ensure_registered(
            registry,
            manifest,
            lambda line: say(f"default environment: {line}"),
            builder,
            work_dir=work_dir,
        )
        entry = ensured.entry
        if not ensured.built:
            built_at = datetime.datetime.fromtimestamp(entry.built_at, datetime.UTC)
            say(
                f"default environment: reusing {entry.digest[:12]} "
                f"(built {built_at:%Y-%m-%d %H:%M} UTC from {manifest_path} as it is now)"
            )
        cache = EnvCache(Path(jobs.sandbox.cache_dir), registry)
        if not cache.cached(entry.digest):
            say(f"default environment: unpacking it into {cache.root}")
            cache.get(entry.digest)
    except (BuildError, StorageError, SandboxError, OSError) as exc:
        needs = "" if os.geteuid() == 0 else "; building needs root (or mmdebstrap's unshare mode)"
        raise DefaultEnvironmentFailed(
            f"the default environment ({manifest_path}) could not be made ready: {exc}{needs} "
            f"({_OPT_OUT})"
        ) from exc
    say(f"default environment: {entry.digest[:12]}; jobs naming no environment run in it")
    return entry
