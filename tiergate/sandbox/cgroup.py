"""Where per-job cgroups go: ``<root>/<cgroup_parent>`` (v2) or that under each of v1's
memory, pids and cpu controllers, made ready for children with those controllers.

Root creates the parent. An unprivileged worker needs it delegated: on v1 the parent
directories chowned to its user; on v2 a chowned parent whose ``cgroup.subtree_control``
enables ``+memory +pids +cpu`` and that holds the worker (moving a process needs write
access to the common ancestor), or else the worker's own cgroup when it is writable (a
systemd ``Delegate=yes`` unit, a container's namespace): the worker then moves itself
into a leaf ``<own>/worker`` first, since v2 lets no cgroup with processes enable
controllers for its children.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from tiergate.jobsettings import SandboxSettings
from tiergate.sandbox.errors import LimitsUnavailable

CONTROLLERS = ("memory", "pids", "cpu")
_WANTED = " ".join(f"+{c}" for c in CONTROLLERS)


@dataclass(frozen=True, slots=True)
class CgroupParent:
    """The directories under which one job's cgroup is made: v2 one, v1 one per controller."""

    version: int
    dirs: tuple[Path, ...]

    def describe(self) -> str:
        if self.version == 2:
            return f"cgroup v2 at {self.dirs[0]}"
        first = self.dirs[0]
        root, rel = first.parent.parent, first.relative_to(first.parent.parent / CONTROLLERS[0])
        return f"cgroup v1 at {root}/{{{','.join(CONTROLLERS)}}}/{rel}"


def write(path: Path, value: str) -> None:
    """Write a cgroup file; never create one (a missing file means no such controller)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def find_parent(settings: SandboxSettings) -> CgroupParent:
    """The ready parent, or :class:`LimitsUnavailable` saying what was tried and how to fix it."""
    root = Path(settings.cgroup_root)
    tried: list[str] = []
    if (root / "cgroup.controllers").exists():
        parent = _v2(root, settings, tried)
        if parent is not None:
            return parent
    elif (root / CONTROLLERS[0] / "tasks").exists():
        parent = _v1(root, settings, tried)
        if parent is not None:
            return parent
    else:
        tried.append(f"no cgroup filesystem (v2, or v1 with a memory controller) at {root}")
    raise unavailable(settings, tried)


def _v1(root: Path, settings: SandboxSettings, tried: list[str]) -> CgroupParent | None:
    dirs = []
    for controller in CONTROLLERS:
        base = root / controller
        path = base / settings.cgroup_parent
        try:
            if not (base / "tasks").exists():
                raise FileNotFoundError(f"no v1 {controller} controller mounted at {base}")
            path.mkdir(parents=True, exist_ok=True)  # jobs start at once: a race is fine
            if not os.access(path, os.W_OK):
                raise PermissionError(f"{path} is not writable by uid {os.geteuid()}")
        except OSError as exc:
            tried.append(f"cgroup v1 parent {path}: {exc}")
            return None
        dirs.append(path)
    return CgroupParent(1, tuple(dirs))


def _v2(root: Path, settings: SandboxSettings, tried: list[str]) -> CgroupParent | None:
    parent = root / settings.cgroup_parent
    own = _own_v2(root)
    try:
        if os.geteuid() != 0 and own is not None:
            # Moving a process needs write access where its old and new cgroups meet.
            meet = Path(os.path.commonpath([own, parent]))
            if not os.access(meet / "cgroup.procs", os.W_OK):
                raise PermissionError(
                    f"the worker runs in {own}, outside it, and may not move processes "
                    f"through {meet}"
                )
        _prepare(root, parent)
        return CgroupParent(2, (parent,))
    except OSError as exc:
        tried.append(f"cgroup v2 parent {parent}: {exc}")
    if own is None:
        tried.append("the worker's own cgroup: not found in /proc/self/cgroup")
        return None
    # After a first move the worker lives in <own>/worker, the parent beside it.
    if own.name == "worker" and (own.parent / settings.cgroup_parent).is_dir():
        own = own.parent
    parent = own / settings.cgroup_parent
    try:
        if not os.access(own / "cgroup.procs", os.W_OK):
            raise PermissionError(f"{own} is not delegated to uid {os.geteuid()}")
        if not _enabled(own):
            leaf = own / "worker"
            leaf.mkdir(exist_ok=True)
            for pid in (own / "cgroup.procs").read_text().split():
                # One gone already is fine; one that cannot move fails the next step.
                with contextlib.suppress(OSError):
                    write(leaf / "cgroup.procs", pid)
        _prepare(own, parent)
        return CgroupParent(2, (parent,))
    except OSError as exc:
        tried.append(f"cgroup v2 in the worker's own cgroup, {parent}: {exc}")
        return None


def _enabled(path: Path) -> bool:
    return set(CONTROLLERS) <= set((path / "cgroup.subtree_control").read_text().split())


def _prepare(top: Path, parent: Path) -> None:
    """Make every level from ``top`` down to ``parent`` hand the controllers down."""
    level = top
    for part in (*parent.relative_to(top).parts, None):
        if not _enabled(level):
            write(level / "cgroup.subtree_control", _WANTED)
        if part is None:
            return
        level = level / part
        level.mkdir(exist_ok=True)


def _own_v2(root: Path) -> Path | None:
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            return root / line[3:].strip().lstrip("/")
    return None


def unavailable(settings: SandboxSettings, tried: list[str]) -> LimitsUnavailable:
    root, name, uid = settings.cgroup_root, settings.cgroup_parent, os.geteuid()
    v1 = f"{root}/{{{','.join(CONTROLLERS)}}}/{name}"
    return LimitsUnavailable(
        "sandbox limits unavailable: could not create a cgroup with memory, pids and cpu "
        f"limits for jobs. Tried: {'; '.join(tried)}. To fix, run the worker as root, or "
        f"delegate the parent to uid {uid}: on cgroup v1 `mkdir -p {v1} && chown -R {uid} "
        f"{v1}`; on cgroup v2 `mkdir {root}/{name} && chown -R {uid} {root}/{name}`, "
        f"enable '{_WANTED}' in {root}/cgroup.subtree_control and start the worker inside "
        f"{root}/{name} (or give it a delegated cgroup of its own, e.g. systemd "
        "Delegate=yes). Or set jobs.sandbox.allow_unlimited=true to run jobs WITHOUT "
        "memory, CPU and process limits.",
        reason="; ".join(tried),
    )
