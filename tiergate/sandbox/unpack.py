"""Unpack a workspace archive in a process of its own, as the job's user.

Why a process of its own: the archive is a tenant's, and ``tarfile`` parses it. Whatever
that costs (a member list, a PAX header of any size, a decompressor's window) is this
process's, under an address-space limit, never the worker's; and whatever a parsing bug or
a filter bypass (the known ones depend on the interpreter's patch level) makes it write, it
writes with the job's own uid and gid (``setpriv --no-new-privs``, see
:func:`tiergate.sandbox.files.extract`), so it reaches nothing the job could not.

Run as ``python -I -S unpack.py WORKSPACE MAX_BYTES MAX_MEMBERS`` with the archive (any
compression) on standard input, a regular file: it is read twice, once for the headers
alone (member count, unpacked size and names are checked before a byte is written), then
to unpack. Members are read one at a time and none is kept (``tarfile`` keeps every member
it reads; that list is emptied as it goes), so a hundred thousand empty members cost one
member record at a time. Exit status 0: unpacked; :data:`REFUSED`: refused, the reason on
standard error (one line, no worker path in it); anything else: a crash.

Standard library only, run by path: it imports nothing of the worker's (no settings, no
site packages) and starts fast.
"""

from __future__ import annotations

import lzma
import os
import sys
import tarfile
import zlib
from collections.abc import Callable, Iterator
from typing import IO

REFUSED = 2
_MESSAGE_CHARS = 1000  # a member's name can be as long as a PAX header: cut in messages


class Refused(Exception):
    """The archive is not one to unpack (the message says why, for the job's error)."""


def _name(member: tarfile.TarInfo) -> str:
    return repr(member.name[:200])


def _members(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """Each member in order, none kept after the next is read."""
    while (member := tar.next()) is not None:
        tar.members.clear()  # type: ignore[attr-defined]  # (not in typeshed)
        yield member


def _inside(path: str, dest: str) -> bool:
    return os.path.commonpath([os.path.realpath(path), dest]) == dest


def _safe(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """What ``filter="data"`` allows, for Pythons without extraction filters (before
    3.11.4, e.g. Debian 12's 3.11.2, which a child as another user may end up running):
    directories, regular files, and links that stay in ``dest`` (its real path), as its
    files are on disk at the time; the owner may read and write what it unpacks."""
    name = member.name
    if name.startswith("/") or not _inside(os.path.join(dest, name), dest):
        raise Refused(f"the workspace archive has a member outside the workspace: {_name(member)}")
    if member.issym() or member.islnk():
        base = os.path.dirname(name) if member.issym() else ""
        target = os.path.join(dest, base, member.linkname)
        if member.linkname.startswith("/") or not _inside(target, dest):
            raise Refused(f"the workspace archive has a link out of the workspace: {_name(member)}")
    elif not (member.isreg() or member.isdir()):
        raise Refused(f"the workspace archive has a special file: {_name(member)}")
    keep = 0o700 if member.isdir() else 0o600
    member.mode = (member.mode | keep) & 0o755
    member.uid = member.gid = 0
    member.uname = member.gname = ""
    return member


_DATA: Callable[[tarfile.TarInfo, str], tarfile.TarInfo] | None = getattr(
    tarfile, "data_filter", None
)


_FILTER_ERROR: type[Exception] = getattr(tarfile, "FilterError", Refused)


def _refusal(exc: Exception) -> str:
    """What the data filter refused, without its text (which names the worker's paths)."""
    member: tarfile.TarInfo | None = getattr(exc, "tarinfo", None)
    name = "" if member is None else f": {_name(member)}"
    kind = type(exc).__name__
    if kind in ("AbsoluteLinkError", "LinkOutsideDestinationError"):
        return f"the workspace archive has a link out of the workspace{name}"
    if kind == "SpecialFileError":
        return f"the workspace archive has a special file{name}"
    return f"the workspace archive has a member outside the workspace{name}"


def check(source: IO[bytes], dest: str, max_bytes: int, max_members: int) -> None:
    """Read the headers alone: refused over ``max_members`` members, over ``max_bytes``
    unpacked, or with a member the filter refuses."""
    allowed = _DATA or _safe
    total = count = 0
    with tarfile.open(fileobj=source, mode="r|*") as tar:
        for member in _members(tar):
            count += 1
            if count > max_members:
                raise Refused(
                    f"the workspace archive has more than {max_members} members "
                    "(sandbox.max_upload_members)"
                )
            total += member.size if member.isreg() else 0
            if total > max_bytes:
                raise Refused(
                    f"the workspace archive unpacks to more than {max_bytes} bytes "
                    "(the job's disk limit)"
                )
            allowed(member, dest)


def unpack(source: IO[bytes], dest: str, max_bytes: int, max_members: int) -> None:
    """Check the archive (:func:`check`), then unpack it into ``dest`` member by member."""
    check(source, dest, max_bytes, max_members)
    source.seek(0)
    with tarfile.open(fileobj=source, mode="r|*") as tar:
        for member in _members(tar):
            # Filtered again as it is unpacked: links made by earlier members count now.
            if _DATA is not None:
                tar.extract(member, dest, filter="data")
            else:
                tar.extract(_safe(member, dest), dest)


def main(argv: list[str]) -> int:
    dest, max_bytes, max_members = argv[0], int(argv[1]), int(argv[2])
    real = os.path.realpath(dest)
    try:
        with os.fdopen(0, "rb", closefd=False) as source:
            unpack(source, real, max_bytes, max_members)
        return 0
    except Refused as exc:
        message = str(exc)
    except _FILTER_ERROR as exc:  # its text names the worker's paths: said in our words
        message = _refusal(exc)
    except MemoryError:
        message = "the workspace archive cannot be unpacked: it needs too much memory"
    except (tarfile.TarError, EOFError, OSError, ValueError, zlib.error, lzma.LZMAError) as exc:
        detail = str(exc).replace(real, "/workspace").replace(dest, "/workspace")
        message = f"the workspace archive cannot be unpacked: {detail}"
    sys.stderr.write(message[:_MESSAGE_CHARS].replace("\n", " ") + "\n")
    return REFUSED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
