"""A worker's cache of environments: ``<cache_dir>/envs/<digest>/rootfs``, fetched from
object storage and unpacked once, then bound read-only as the root of every sandbox that
runs in it (no copy per job).

- Atomic: unpacked into ``<digest>.partial`` and renamed to ``<digest>`` when complete, so
  a directory named by a digest is always whole; a worker killed half-way leaves a partial
  directory that the next fetch removes.
- Once: a lock file per digest (``flock``) plus a lock per process, so two slots of one
  worker, or two workers sharing the cache, do not unpack the same digest twice.
- Checked: the blob's sha256 must be its digest (its key) before anything is unpacked.
- Safe unpacking (defence in depth; the content is checked already): no absolute names,
  no ``..``, nothing through a symbolic link the tar made, hard links only to names inside,
  no setuid/setgid bits, owners kept by number (as root), and device nodes, fifos and
  sockets skipped: bubblewrap gives the sandbox its own ``/dev``. Checked by name alone
  (the target starts empty), so it holds on Pythons without extraction filters too.
  Symbolic links may point anywhere: they are resolved inside the sandbox, whose root
  this is.
- Readable by the sandbox's user: the directories up to ``rootfs`` are 0755; the files
  keep the modes the packages gave them.

Using it needs no privilege (a worker as uid 65534 unpacks and binds it the same way; it
then owns the files, which changes nothing for reading in the sandbox); building needs
root (:mod:`tiergate.envs.build`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import posixpath
import shutil
import stat
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

from tiergate.envs.build import sha256_file
from tiergate.envs.registry import Registry
from tiergate.sandbox.errors import SandboxError

# Mount points the sandbox puts its own file systems on (bubblewrap cannot make them in a
# read-only root).
MOUNT_POINTS = ("proc", "dev", "tmp", "var/tmp", "run", "workspace")

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def _thread_lock(key: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


class EnvCache:
    def __init__(self, cache_dir: Path, registry: Registry) -> None:
        self.root = Path(cache_dir) / "envs"
        self._registry = registry

    def rootfs(self, digest: str) -> Path:
        return self.root / digest / "rootfs"

    def cached(self, digest: str) -> bool:
        return self.rootfs(digest).is_dir()

    def get(self, digest: str) -> Path:
        """The unpacked root of ``digest``, fetched first if not cached. Raises
        :class:`~tiergate.objectstore.StorageError` (fetch) or :class:`SandboxError`."""
        if len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
            raise SandboxError(f"{digest!r} is not an environment digest")
        path = self.rootfs(digest)
        if path.is_dir():
            return path
        with _thread_lock(digest), self._file_lock(digest):
            if path.is_dir():
                return path  # another slot or worker got there first
            self._fetch(digest)
        return path

    @contextlib.contextmanager
    def _file_lock(self, digest: str) -> Iterator[None]:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self.root.chmod(0o755)
            fd = os.open(self.root / f".{digest}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        except OSError as exc:
            raise SandboxError(f"cannot use the environment cache {self.root}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _fetch(self, digest: str) -> None:
        partial = self.root / f"{digest}.partial"
        _remove(partial)
        try:
            partial.mkdir(mode=0o755)
            blob = partial / "blob.tar"
            self._registry.download(digest, blob)
            got = sha256_file(blob)
            if got != digest:
                raise SandboxError(f"environment {digest[:12]}: the blob's sha256 is {got[:12]}")
            unpack(blob, partial / "rootfs")
            blob.unlink()
            os.replace(partial, self.root / digest)
        except OSError as exc:
            raise SandboxError(f"environment {digest[:12]} could not be unpacked: {exc}") from exc
        finally:
            _remove(partial)


def unpack(blob: Path, target: Path) -> None:
    target.mkdir(mode=0o755)
    try:
        with tarfile.open(blob) as tar:
            members = _safe_members(tar)
            if hasattr(tarfile, "data_filter"):
                # Checked already; "fully_trusted" only says so (and silences the warning).
                tar.extractall(target, members, numeric_owner=True, filter="fully_trusted")
            else:  # Debian 12's Python 3.11.2, which a non-root worker may run: no filters
                tar.extractall(target, members, numeric_owner=True)
    except (tarfile.TarError, EOFError, ValueError) as exc:
        raise SandboxError(f"the environment's tar cannot be unpacked: {exc}") from exc
    for name in MOUNT_POINTS:
        point = target / name
        if not point.is_dir() and not point.is_symlink():
            point.mkdir(parents=True, exist_ok=True)
    target.chmod(0o755)


def _safe_members(tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    """The members to unpack, checked by name alone (the target starts empty, so what
    the tar itself makes is all there is): no absolute names, no ``..``, nothing through a
    symbolic link the tar made, hard links only to names inside; devices, fifos skipped;
    setuid and setgid bits dropped."""
    links: set[str] = set()
    keep = []

    def check(name: str, what: str) -> str:
        norm = posixpath.normpath(name.removeprefix("./") or ".")
        parts = norm.split("/")
        if norm.startswith("/") or ".." in parts:
            raise SandboxError(f"the environment has an unsafe {what}: {name!r}")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in links:
                raise SandboxError(f"the environment has a {what} through a link: {name!r}")
        return norm

    for member in tar:
        if member.ischr() or member.isblk() or member.isfifo():
            continue
        if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
            continue
        norm = check(member.name, "name")
        if member.islnk():
            check(member.linkname, "hard link")
        if member.issym():
            links.add(norm)
        member.mode &= ~0o6000
        keep.append(member)
    return keep


def _remove(path: Path) -> None:
    """Remove a tree, read-only directories in it (``/proc`` is 0555) included."""

    def writable(fn: object, name: str, _exc: object) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(name), stat.S_IRWXU)
            if os.path.isdir(name) and not os.path.islink(name):
                os.chmod(name, stat.S_IRWXU)
                shutil.rmtree(name, ignore_errors=True)
            else:
                os.unlink(name)

    if path.exists():
        shutil.rmtree(path, onerror=writable)
