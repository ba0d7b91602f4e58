"""Free disk space, checked before it runs out rather than found out from what then fails.

A nearly full disk made the local stack fail late and unclearly: SeaweedFS turns every
volume read-only when less than 1% of its disk is free (its ``-minFreeSpace`` default),
the broker that keeps its log there then times out, and a model download or a compile
cache write fails minutes into a start. One check up front names the filesystem, what it
has and what it needs.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

GIB = 1024**3
MIB = 1024**2
# Free space the local stack wants above SeaweedFS's floor on each disk it writes: the
# model (about 1 GiB), two quantized checkpoints, compile caches, logs and job data.
STACK_MIN_FREE_GIB = 4.0
# SeaweedFS's own floor (volumes read-only below it), as a fraction of the disk's size.
STORE_FLOOR_FRACTION = 0.01


@dataclass(frozen=True)
class DiskSpace:
    """One filesystem: ``path`` (the first path checked on it), its free and total bytes,
    and the free bytes it needs."""

    path: Path
    free: int
    total: int
    needed: int

    @property
    def ok(self) -> bool:
        return self.free >= self.needed

    def describe(self) -> str:
        return (
            f"{self.path}: {self.free / GIB:.1f} GiB free of {self.total / GIB:.1f} GiB, "
            f"needs {self.needed / GIB:.1f} GiB"
        )


def _existing(path: Path) -> Path:
    """``path``, or its nearest ancestor that exists (what it will be created on)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def disk_space(path: Path, needed: int) -> DiskSpace:
    usage = shutil.disk_usage(_existing(path))
    return DiskSpace(path, usage.free, usage.total, needed)


def stack_needs(total: int, min_free_gib: float) -> int:
    """What the local stack needs free on a disk of ``total`` bytes: SeaweedFS's floor and
    ``min_free_gib`` above it (models, quantized checkpoints, compile caches, job data)."""
    return int(total * STORE_FLOOR_FRACTION) + int(min_free_gib * GIB)


def check_stack_disks(paths: Iterable[Path], min_free_gib: float) -> list[DiskSpace]:
    """Each distinct filesystem under ``paths`` (once, by device), against
    :func:`stack_needs`."""
    seen: set[int] = set()
    checked = []
    for path in paths:
        where = _existing(path)
        device = os.stat(where).st_dev
        if device in seen:
            continue
        seen.add(device)
        space = disk_space(path, 0)
        checked.append(dataclasses.replace(space, needed=stack_needs(space.total, min_free_gib)))
    return checked


def low_disk_message(checked: Iterable[DiskSpace]) -> str | None:
    """What to tell the operator when a filesystem is short of space, or None."""
    low = [d for d in checked if not d.ok]
    if not low:
        return None
    lines = "\n".join(f"  {d.describe()}" for d in low)
    return (
        "not enough free disk space to start:\n"
        f"{lines}\n"
        "  (SeaweedFS turns read-only below 1% free; the models, checkpoints and caches "
        "need the rest). Free some space, or lower the margin with --min-free-gib."
    )
