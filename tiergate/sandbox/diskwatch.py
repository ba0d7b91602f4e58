"""The workspace's disk use watched while a command runs, not only between commands.

A command may write as fast as the disk takes it, or make millions of empty files and
directories (inodes, which a byte count never sees). Between commands the runner checks the
workspace (:meth:`tiergate.sandbox.Sandbox.check_disk`); during one, :class:`DiskWatch`
walks it every ``interval`` seconds (longer when a walk itself takes long, so that watching
never costs more than about a third of a core) and kills the command the moment it holds
more bytes (allocated blocks, so a sparse file costs what it really uses) or more entries
than the job may. What it cannot do is stop a write mid-walk: a command can go past the
limit by what it writes in one interval (RLIMIT_FSIZE, also set, caps any single file at
the disk limit). A per-workspace filesystem with quotas (a loop-mounted image, XFS project
quotas) would be exact, but needs privileges a worker pod does not have; this needs none.

A walk sees only files that have a name. A file the job removed but still holds open, or
mapped, keeps its blocks on the disk all the same, so each pass also counts those of the
job's processes (:func:`held_unlinked`: their open descriptors and mappings, through
``/proc``, on the workspace's file system). A descriptor in flight in a Unix socket's
queue, held by no process, is not seen; it is gone with the command's processes.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tiergate.sandbox.owned import Walk


@dataclass(frozen=True, slots=True)
class Usage:
    bytes: int
    entries: int
    # Directories that could not be listed even after the worker gave itself its bits
    # back (tiergate.sandbox.owned): what they hold is not counted, so callers refuse.
    hidden: int = 0


def usage(top: Path, stop_at_entries: int | None = None) -> Usage:
    """Bytes allocated and entries (files, directories, links, anything) under ``top``;
    symbolic links not followed. Stops counting past ``stop_at_entries``."""
    total = 0
    walk = Walk(top, stop_at=stop_at_entries)
    for entry in walk:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        total += max(st.st_blocks * 512, 0)
    return Usage(total, walk.entries, walk.hidden)


def held_unlinked(pids: Iterable[int], device: int) -> int:
    """Bytes allocated to files on ``device`` that have no name left (removed) and that the
    processes ``pids`` still hold open or mapped; each file once."""
    sizes: dict[int, int] = {}
    major, minor = os.major(device), os.minor(device)
    for pid in pids:
        fds = f"/proc/{pid}/fd"
        try:
            names = os.listdir(fds)
        except OSError:  # gone, or not ours to read
            names = []
        for name in names:
            try:
                st = os.stat(f"{fds}/{name}")  # the open file itself, named or not
            except OSError:
                continue
            if st.st_dev == device and st.st_nlink == 0 and stat.S_ISREG(st.st_mode):
                sizes[st.st_ino] = max(sizes.get(st.st_ino, 0), st.st_blocks * 512)
        try:
            with open(f"/proc/{pid}/maps") as maps:
                lines = maps.readlines()
        except OSError:
            continue
        for line in lines:
            # start-end perms offset major:minor inode path, " (deleted)" once removed
            if not line.rstrip().endswith("(deleted)"):
                continue
            fields = line.split(maxsplit=5)
            try:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                dev_major, dev_minor = (int(x, 16) for x in fields[3].split(":"))
                inode, offset = int(fields[4]), int(fields[2], 16)
            except (IndexError, ValueError):
                continue
            if (dev_major, dev_minor) == (major, minor) and inode:
                # What the mappings reach of the file: at most its allocated size.
                sizes[inode] = max(sizes.get(inode, 0), offset + end - start)
    return sum(sizes.values())


HIDDEN = (
    "the workspace holds a directory the worker cannot read, so its disk use cannot be "
    "counted; leave the owner's read and execute bits on the job's directories"
)


class DiskWatch:
    """Watches ``top`` while a command runs; calls ``kill`` once, and keeps why in
    :attr:`exceeded`, when the workspace goes over ``max_bytes`` or ``max_entries``."""

    def __init__(
        self,
        top: Path,
        max_bytes: int,
        max_entries: int,
        kill: Callable[[], None],
        interval: float = 0.2,
        pids: Callable[[], list[int]] | None = None,
    ) -> None:
        """``pids``: the command's processes, whose removed but open or mapped files count
        (:func:`held_unlinked`)."""
        self._top = top
        self._pids = pids
        self._device = top.stat().st_dev
        self._max_bytes = max_bytes
        self._max_entries = max_entries
        self._kill = kill
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="sandbox-diskwatch", daemon=True)
        self.exceeded: str | None = None

    def __enter__(self) -> DiskWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        wait = self._interval
        while not self._stop.wait(wait):
            started = time.monotonic()
            used = usage(self._top, stop_at_entries=self._max_entries)
            held = held_unlinked(self._pids(), self._device) if self._pids else 0
            if used.bytes + held > self._max_bytes:
                removed = f" ({held} of them in removed files still open)" if held else ""
                self.exceeded = (
                    f"the command was stopped: the workspace held {used.bytes + held} bytes"
                    f"{removed}, over the job's disk limit of {self._max_bytes} bytes"
                )
            elif used.entries > self._max_entries:
                self.exceeded = (
                    "the command was stopped: the workspace held more than "
                    f"{self._max_entries} files and directories (the job's limit)"
                )
            elif used.hidden:
                self.exceeded = f"the command was stopped: {HIDDEN}"
            if self.exceeded is not None:
                self._kill()
                return
            wait = max(self._interval, 2 * (time.monotonic() - started))
