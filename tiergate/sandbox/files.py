"""The workspace's files: what goes in (inline files, a tar archive), what comes out, and
its size. Whatever a job's spec or archive gets wrong is a :class:`SandboxError` (the job
fails with a reason), never an ``OSError`` or a ``tarfile`` error from deep inside.
"""

from __future__ import annotations

import contextlib
import io
import lzma
import os
import posixpath
import shutil
import tarfile
import zlib
from pathlib import Path

from tiergate.sandbox.errors import SandboxError

_BAD_ARCHIVE = (tarfile.TarError, EOFError, OSError, ValueError, zlib.error, lzma.LZMAError)


def write_files(workspace: Path, files: dict[str, str]) -> None:
    top = workspace.resolve()
    for rel, content in files.items():
        if not rel or "\0" in rel:
            raise SandboxError(f"{rel!r} is not a usable file name")
        try:
            target = (workspace / rel).resolve()
            if not target.is_relative_to(top) or target == top:
                raise SandboxError(f"{rel!r} is outside the workspace")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
        except (OSError, ValueError) as exc:
            # e.g. both "a" and "a/b" given: one of them cannot be made
            raise SandboxError(f"cannot write {rel!r} in the workspace: {exc}") from exc


def extract(workspace: Path, archive: bytes, max_bytes: int) -> None:
    """Unpack a tar archive (any compression) after checking its unpacked size.

    The check reads only headers, so an archive that would fill the disk is refused before
    a byte is written; ``filter="data"`` refuses links and paths out of the workspace.
    """
    try:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            total = 0
            for member in tar:
                total += member.size if member.isreg() else 0
                if total > max_bytes:
                    raise SandboxError(
                        f"the workspace archive unpacks to more than {max_bytes} bytes "
                        "(the job's disk limit)"
                    )
            if hasattr(tarfile, "data_filter"):
                tar.extractall(workspace, filter="data")
            else:
                # Pythons before 3.11.4 (Debian 12's 3.11.2, which an unprivileged worker
                # may run) have no extraction filters: refuse what "data" would refuse.
                tar.extractall(workspace, members=[_safe(m) for m in tar.getmembers()])
    except _BAD_ARCHIVE as exc:
        raise SandboxError(f"the workspace archive cannot be unpacked: {exc}") from exc


def _safe(member: tarfile.TarInfo) -> tarfile.TarInfo:
    name = posixpath.normpath(member.name)
    if name.startswith(("/", "..")) or not (member.isreg() or member.isdir()):
        raise SandboxError(f"the workspace archive has an unsafe member: {member.name!r}")
    member.mode = (member.mode | 0o600) & 0o755
    member.uid = member.gid = 0
    member.uname = member.gname = ""
    return member


def archive(workspace: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(workspace, arcname="workspace")
    return buffer.getvalue()


def workspace_bytes(workspace: Path) -> int:
    """The files' apparent sizes (symbolic links not followed, hard links counted each)."""
    total = 0
    for dirpath, _dirs, names in os.walk(workspace):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def copy_tree(source: Path, target: Path) -> list[str]:
    """Copy a workspace: directories, regular files (content and mode) and symbolic links
    (as links, never followed); fifos, sockets and devices are left out, and so is what
    cannot be read. Returns the relative paths left out. Hard links become separate files.
    """
    left: list[str] = []
    target.mkdir(mode=0o755)

    def walk(src: Path, dst: Path, rel: str) -> None:
        try:
            entries = sorted(os.scandir(src), key=lambda e: e.name)
        except OSError:
            left.append(rel or ".")
            return
        for entry in entries:
            name = f"{rel}/{entry.name}" if rel else entry.name
            out = dst / entry.name
            try:
                if entry.is_symlink():
                    os.symlink(os.readlink(entry.path), out)
                elif entry.is_dir(follow_symlinks=False):
                    out.mkdir()
                    walk(Path(entry.path), out, name)
                    os.chmod(out, entry.stat(follow_symlinks=False).st_mode & 0o777)
                elif entry.is_file(follow_symlinks=False):
                    shutil.copyfile(entry.path, out, follow_symlinks=False)
                    os.chmod(out, entry.stat(follow_symlinks=False).st_mode & 0o777)
                else:
                    left.append(name)
            except OSError:
                left.append(name)

    walk(source, target, "")
    return left
