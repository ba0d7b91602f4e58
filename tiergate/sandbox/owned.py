"""The worker's reach into a workspace a job may have locked against it.

A root worker reads and removes whatever a job leaves. A non-root one (the chart's, uid
10001) runs its jobs as itself, and a job can take its own bits away: a directory of mode
``d-wx`` that it writes into cannot be listed, so a walk that skips what it cannot read saw
4 KiB of 60 MiB hidden there, the cleanup's ``rmtree(ignore_errors=True)`` left it behind,
and a mode-000 file failed the artifact. The worker owns those files: here it gives itself
the owner's bits back (never anyone else's, never through a link: the mode is changed
through an ``O_PATH`` descriptor opened with ``O_NOFOLLOW``, on the inode it names) before
it reads or removes, and counts what it still cannot read (:attr:`Walk.hidden`) so that a
caller can refuse rather than undercount.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path


def unlock(path: str | Path, bits: int) -> bool:
    """Give ``path`` (not followed if it is a link) the owner's ``bits`` (e.g. ``0o700``)
    when this process owns it and they are missing; True when its mode changed."""
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & bits == bits:
            return False
        os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(st.st_mode) | bits)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


class Walk:
    """Every entry under ``top`` (links not followed), depth first; a directory that cannot
    be listed is unlocked and listed again, and counted in :attr:`hidden` when it still
    cannot be. ``unlock_all``: every directory on the way is given the owner's ``rwx``
    (so that its entries can then be removed). Stops past ``stop_at`` entries."""

    def __init__(
        self,
        top: str | Path,
        stop_at: int | None = None,
        unlock_all: bool = False,
        ordered: bool = False,
    ) -> None:
        """``ordered``: each directory's entries by name (held a directory at a time);
        otherwise as the file system gives them, none held."""
        self._top = str(top)
        self._stop_at = stop_at
        self._unlock_all = unlock_all
        self._ordered = ordered
        self.hidden = 0
        self.entries = 0

    def __iter__(self) -> Iterator[os.DirEntry[str]]:
        pending = [self._top]
        while pending:
            path = pending.pop()
            if self._unlock_all:
                unlock(path, 0o700)
            children: list[str] = []
            for entry in self._list(path):
                self.entries += 1
                yield entry
                if entry.is_dir(follow_symlinks=False):
                    children.append(entry.path)
                if self._stop_at is not None and self.entries > self._stop_at:
                    return
            pending += reversed(children)

    def _list(self, path: str) -> Iterator[os.DirEntry[str]]:
        for attempt in range(2):
            try:
                it = os.scandir(path)
            except FileNotFoundError:
                return
            except PermissionError:
                if attempt or not unlock(path, 0o700):
                    break
                continue
            except OSError:
                break
            with it:
                yield from sorted(it, key=lambda e: e.name) if self._ordered else it
            return
        self.hidden += 1


def remove_tree(path: str | Path) -> bool:
    """Remove ``path`` and everything under it, whatever modes a job left there; True when
    it is gone."""
    for _ in range(3):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            return True
        for _entry in Walk(path, unlock_all=True):
            pass
    return not os.path.lexists(path)
