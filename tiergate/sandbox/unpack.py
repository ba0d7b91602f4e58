"""Unpack a workspace archive in a process of its own, as the job's user, writing every
member itself.

Why a process of its own: the archive is a tenant's, and ``tarfile`` parses it. Whatever
that costs (a member list, a PAX header of any size, a decompressor's window) is this
process's, under an address-space limit, never the worker's; and it writes with the job's
own uid and gid (``setpriv --no-new-privs``, see :func:`tiergate.sandbox.files.extract`),
inside a bubblewrap jail that holds the workspace alone, writable.

Why it writes the members itself: ``tarfile``'s extraction filters (``filter="data"``)
judge paths with ``os.path.realpath``, and their known bypasses (CVE-2025-4517, fixed in
3.11.13/3.12.11) depend on the interpreter's patch level, which an image's floating tag
does not pin. Here ``tarfile`` only parses; each member is checked from its name alone
(relative, no ``..``, a link's target inside the workspace as written, a hard link only to
an earlier regular file of the archive; no devices, fifos or sparse files), and written
through directory file descriptors opened with ``O_NOFOLLOW`` one component at a time, new
files with ``O_EXCL | O_NOFOLLOW``: no link, whatever an earlier member made or what it
points at, is ever followed. Modes keep the owner's read and write and lose set-id bits.

Run as ``python -I -S unpack.py WORKSPACE MAX_BYTES MAX_MEMBERS`` with the archive (any
compression) on standard input, a regular file: it is read twice, once for the headers
alone (member count, unpacked size and names are checked before a byte is written), then
to unpack. Members are read one at a time and none is kept (``tarfile`` keeps every member
it reads; that list is emptied as it goes). Exit status 0: unpacked; :data:`REFUSED`:
refused, the reason on standard error (one line, no worker path in it); anything else: a
crash.

Standard library only, run by path: it imports nothing of the worker's (no settings, no
site packages) and starts fast.
"""

from __future__ import annotations

import contextlib
import errno
import lzma
import os
import posixpath
import stat
import sys
import tarfile
import zlib
from collections.abc import Iterator
from typing import IO

REFUSED = 2
_MESSAGE_CHARS = 1000  # a member's name can be as long as a PAX header: cut in messages
_COPY_BYTES = 1024 * 1024
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class Refused(Exception):
    """The archive is not one to unpack (the message says why, for the job's error)."""


def _name(member: tarfile.TarInfo) -> str:
    return repr(member.name[:200])


def _members(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """Each member in order, none kept after the next is read."""
    while (member := tar.next()) is not None:
        tar.members.clear()  # type: ignore[attr-defined]  # (not in typeshed)
        yield member


def _parts(name: str, member: tarfile.TarInfo) -> list[str]:
    """The member's path as components below the workspace; refused when it is absolute,
    empty, or climbs out with ``..``."""
    if name.startswith("/") or "\0" in name:
        raise Refused(f"the workspace archive has a member outside the workspace: {_name(member)}")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise Refused(f"the workspace archive has a member outside the workspace: {_name(member)}")
    return parts


def _judge(member: tarfile.TarInfo, files: set[str]) -> list[str]:
    """The member's components, or :class:`Refused`; ``files``: the regular files' names so
    far (normalized), which a hard link may name, and to which a regular file is added."""
    parts = _parts(member.name, member)
    if not parts:
        if member.isdir():
            return parts  # "./" itself
        raise Refused(f"the workspace archive has a member with no name: {_name(member)}")
    if member.issym():
        # As written, from the link's own directory. Not what keeps writes inside (nothing
        # here follows a link: a chain of links that leaves is harmless to the unpacking,
        # and the worker follows none either), but an archive that says "elsewhere" is not
        # a workspace.
        target = member.linkname
        joined = posixpath.normpath("/".join([*parts[:-1], target]))
        if target.startswith("/") or "\0" in target or joined == ".." or joined.startswith("../"):
            raise Refused(f"the workspace archive has a link out of the workspace: {_name(member)}")
    elif member.islnk():
        target = "/".join(_parts(member.linkname, member))
        if target not in files:
            raise Refused(
                "the workspace archive has a hard link to what is not an earlier file of "
                f"it: {_name(member)}"
            )
    elif member.isreg() and member.type != tarfile.GNUTYPE_SPARSE:
        files.add("/".join(parts))
    elif not member.isdir():
        raise Refused(f"the workspace archive has a special file: {_name(member)}")
    return parts


def check(source: IO[bytes], max_bytes: int, max_members: int) -> None:
    """Read the headers alone: refused over ``max_members`` members, over ``max_bytes``
    unpacked, or with a member :func:`_judge` refuses."""
    total = count = 0
    files: set[str] = set()
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
            _judge(member, files)


class _Writer:
    """Writes members below the directory ``top`` (an open descriptor), never following a
    link on the way."""

    def __init__(self, top: int) -> None:
        self._top = top
        self._dirs: list[tuple[list[str], int]] = []

    def _open_dir(self, parts: list[str], member: tarfile.TarInfo, make: bool) -> int:
        fd = os.dup(self._top)
        try:
            for part in parts:
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not make:
                        raise
                    os.mkdir(part, 0o755, dir_fd=fd)  # as tar makes a parent it was not given
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise Refused(
                            "the workspace archive has a member below a link or a file: "
                            f"{_name(member)}"
                        ) from None
                    raise
                os.close(fd)
                fd = child
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _clear(self, parent: int, leaf: str) -> None:
        """Make room for a new entry ``leaf`` (a later member of the same name replaces an
        earlier one, as tar does); a directory stays, and the member is then refused."""
        try:
            st = os.stat(leaf, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            raise Refused(f"the workspace archive has a member over a directory: {leaf[:200]!r}")
        os.unlink(leaf, dir_fd=parent)

    def write(self, tar: tarfile.TarFile, member: tarfile.TarInfo, parts: list[str]) -> None:
        if member.isdir():
            fd = self._open_dir(parts, member, make=True)
            self._dirs.append((parts, (member.mode & 0o755) | 0o700))
            os.close(fd)
            return
        parent = self._open_dir(parts[:-1], member, make=True)
        leaf = parts[-1]
        try:
            self._clear(parent, leaf)
            if member.issym():
                os.symlink(member.linkname, leaf, dir_fd=parent)
            elif member.islnk():
                self._link(member, parent, leaf)
            else:
                self._file(tar, member, parent, leaf)
        finally:
            os.close(parent)

    def _link(self, member: tarfile.TarInfo, parent: int, leaf: str) -> None:
        target = _parts(member.linkname, member)
        source = self._open_dir(target[:-1], member, make=False)
        try:
            st = os.stat(target[-1], dir_fd=source, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                raise Refused(
                    f"the workspace archive has a hard link to what is not a file: {_name(member)}"
                )
            os.link(target[-1], leaf, src_dir_fd=source, dst_dir_fd=parent, follow_symlinks=False)
        finally:
            os.close(source)

    def _file(self, tar: tarfile.TarFile, member: tarfile.TarInfo, parent: int, leaf: str) -> None:
        data = tar.extractfile(member)
        fd = os.open(leaf, _NEW_FILE, 0o600, dir_fd=parent)
        with os.fdopen(fd, "wb", closefd=True) as out:
            if data is not None:
                while chunk := data.read(_COPY_BYTES):
                    out.write(chunk)
            os.fchmod(out.fileno(), (member.mode & 0o755) | 0o600)
            with contextlib.suppress(OverflowError, OSError, ValueError):
                os.utime(out.fileno(), (member.mtime, member.mtime))

    def finish(self) -> None:
        """Directories' modes last, so that a read-only one did not stop its own members."""
        for parts, mode in reversed(self._dirs):
            fd = self._open_dir(parts, tarfile.TarInfo("/".join(parts)), make=False)
            try:
                os.fchmod(fd, mode)
            finally:
                os.close(fd)


def unpack(source: IO[bytes], dest: str, max_bytes: int, max_members: int) -> None:
    """Check the archive (:func:`check`), then unpack it into ``dest`` member by member."""
    check(source, max_bytes, max_members)
    source.seek(0)
    top = os.open(dest, _DIR_FLAGS)
    try:
        writer = _Writer(top)
        files: set[str] = set()
        with tarfile.open(fileobj=source, mode="r|*") as tar:
            for member in _members(tar):
                writer.write(tar, member, _judge(member, files))
        writer.finish()
    finally:
        os.close(top)


def main(argv: list[str]) -> int:
    dest, max_bytes, max_members = argv[0], int(argv[1]), int(argv[2])
    try:
        with os.fdopen(0, "rb", closefd=False) as source:
            unpack(source, dest, max_bytes, max_members)
        return 0
    except Refused as exc:
        message = str(exc)
    except MemoryError:
        message = "the workspace archive cannot be unpacked: it needs too much memory"
    except (tarfile.TarError, EOFError, OSError, ValueError, zlib.error, lzma.LZMAError) as exc:
        detail = str(exc).replace(dest, "/workspace")
        message = f"the workspace archive cannot be unpacked: {detail}"
    sys.stderr.write(message[:_MESSAGE_CHARS].replace("\n", " ") + "\n")
    return REFUSED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
