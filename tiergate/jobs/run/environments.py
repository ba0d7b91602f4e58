"""A job's environment, resolved in one place for agent runs and replays alike:

- **its name**: the job's (or its spec's) ``environment``, "default" when it names none
  (:func:`name_of`);
- **the digest it runs in**: the registry's entry for that name, looked up at pickup
  (:meth:`JobEnvironments.lookup`) and recorded on the job as it starts; a replay runs in
  the digest its original recorded, while that is still stored (:meth:`JobEnvironments.stored`);
- **the root**: that digest unpacked into the worker's cache (:meth:`JobEnvironments.root`,
  :meth:`JobEnvironments.fetch`); "default" with nothing registered is the worker's own
  system (None); any other name with nothing registered is :class:`EnvironmentNotFound`,
  the job's mistake;
- **its circuit breaker** (tiergate.jobs.state.breaker): read at pickup, asked before
  anything of the job runs (:meth:`JobEnvironments.admit`), told how the job ended
  (:meth:`JobEnvironments.judge`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from tiergate.envs.cache import EnvCache
from tiergate.envs.registry import Registered, Registry
from tiergate.jobs.state.breaker import Breaker, BreakerAdmission, BreakerBoard, FailureKind
from tiergate.jobs.state.store import StorageError

log = logging.getLogger("tiergate.worker")

DEFAULT = "default"


class EnvironmentNotFound(Exception):
    """The job names an environment that is not registered."""


def name_of(job: Any, spec: Any) -> str:
    """The environment a job runs (or ran) in: its own field, else its spec's, else
    "default"."""
    found = getattr(job, "environment", None) or getattr(spec, "environment", None)
    return str(found) if found else DEFAULT


class JobEnvironments:
    """One worker's view of the environments: the registry, its unpacked roots and the
    breakers (shared by every worker through the store)."""

    def __init__(self, registry: Registry, cache: EnvCache, breakers: BreakerBoard) -> None:
        self.registry = registry
        self.breakers = breakers
        self._cache = cache

    def lookup(self, name: str) -> Registered | None:
        """The registered entry for ``name`` (None: nothing registered under it)."""
        return self.registry.resolve(name)

    def stored(self, digest: str) -> bool:
        """Whether the environment with ``digest`` can still be fetched."""
        return self.registry.has_blob(digest)

    def root(self, name: str, entry: Registered | None) -> Path | None:
        """The root a job naming ``name`` runs in, ``entry`` being what :meth:`lookup`
        found: the entry's digest unpacked; "default" unregistered: None, the worker's own
        system; another name unregistered: :class:`EnvironmentNotFound`."""
        if entry is None:
            if name == DEFAULT:
                return None
            raise EnvironmentNotFound(
                f"no environment {name!r} is registered (tiergate env build, tiergate env list)"
            )
        return self.fetch(entry.digest)

    def fetch(self, digest: str) -> Path:
        """The root unpacked from ``digest`` (raises SandboxError or StorageError)."""
        return self._cache.get(digest)

    def read_breaker(self, name: str) -> tuple[Breaker, str | None] | None:
        """The breaker as stored, with its version (None: breakers are off)."""
        return self.breakers.read(name) if self.breakers.enabled else None

    def admit(
        self, name: str, job_id: str, read: tuple[Breaker, str | None] | None
    ) -> BreakerAdmission:
        """Whether a job of ``name`` may run now (``read``: the breaker as read at pickup)."""
        return self.breakers.admit(name, job_id, read)

    def judge(self, name: str, job_id: str, owner: str, verdict: tuple[FailureKind, str]) -> None:
        """Tell the breaker what the job said about its environment; a failure to do so
        does not change the job's ending (a lost probe verdict is taken over, see
        tiergate.jobs.state.breaker)."""
        kind, detail = verdict
        try:
            self.breakers.record(name, job_id, kind, detail, owner=owner)
        except StorageError as exc:
            log.warning("job %s: breaker of %s not updated: %s", job_id, name, exc)
