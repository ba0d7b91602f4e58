"""The workspace's files: what goes in (inline files, a tar archive), what comes out, and
its size. Whatever a job's spec or archive gets wrong is a :class:`SandboxError` (the job
fails with a reason), never an ``OSError`` or a ``tarfile`` error from deep inside.

Neither way holds a workspace in the worker's memory: an archive is unpacked by a child
process under rlimits, as the job's user (:func:`extract`), and the artifact is written to
a file, a block at a time (:func:`archive`), which the store uploads in parts.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from tiergate.sandbox import owned, unpack
from tiergate.sandbox.diskwatch import HIDDEN
from tiergate.sandbox.errors import SandboxError

_MiB = 1024 * 1024
# The unpacking child's limits: its address space (Python, tarfile's buffers, a
# decompressor's window; an xz archive asking for more fails as an archive that cannot be
# unpacked) and its time, CPU and wall clock alike.
UNPACK_MEMORY_BYTES = 512 * _MiB
UNPACK_SECONDS = 300
_UNPACK_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8"}


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


def extract(
    workspace: Path,
    source: BinaryIO,
    max_bytes: int,
    max_members: int,
    run_as: tuple[int, int] | None,
) -> None:
    """Unpack the tar archive (any compression) in ``source``, an open regular file (the
    child reads it twice), into ``workspace``, in a child process
    (:mod:`tiergate.sandbox.unpack`): refused over ``max_members`` members or ``max_bytes``
    unpacked (checked from the headers alone, before a byte is written), and with any
    member ``filter="data"`` refuses (absolute paths, ``..``, links out of the workspace,
    devices). ``run_as``: (uid, gid) the child drops to (a root worker's sandbox user, who
    must be able to write ``workspace``); None: it runs as the worker's own (unprivileged)
    user. Either way under rlimits: the worker spends no memory on a tenant's archive and
    writes nothing of it with its own rights.
    """
    argv = unpack_argv(workspace, max_bytes, max_members, run_as)
    try:
        done = subprocess.run(
            argv,
            stdin=source,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=_UNPACK_ENV,  # nothing of the worker's: the child runs as the job's user
            cwd="/",
            timeout=UNPACK_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise SandboxError(
            f"the workspace archive was not unpacked within {UNPACK_SECONDS} s"
        ) from exc
    except OSError as exc:
        raise SandboxError(f"cannot start unpacking the workspace archive: {exc}") from exc
    if done.returncode == 0:
        return
    reason = done.stderr.decode(errors="replace").strip()[-1000:]
    if done.returncode == unpack.REFUSED and reason:
        raise SandboxError(reason)
    ended = f"killed by signal {-done.returncode}" if done.returncode < 0 else "crashed"
    raise SandboxError(
        f"the workspace archive cannot be unpacked (the unpacking process {ended}; it may "
        f"use at most {UNPACK_MEMORY_BYTES // _MiB} MiB)"
    )


def unpack_argv(
    workspace: Path, max_bytes: int, max_members: int, run_as: tuple[int, int] | None
) -> list[str]:
    """The child's command line: rlimits (prlimit), the drop to ``run_as`` (setpriv, no
    new privileges), a bubblewrap jail in which only the workspace is writable (and
    nothing of the worker's is visible but the interpreter), then the standard library's
    Python alone (``-I -S``) running unpack.py's text, given on the command line (``-c``):
    the worker reads it, so the job's user needs no access to the worker's files beyond
    its interpreter. A bug in ``tarfile`` or in the unpacker can then write the workspace
    and nothing else, whatever uid the child runs as (a non-root worker's jobs, and its
    environment cache, share one)."""
    interpreter = _interpreter(run_as is not None)
    python = [str(interpreter), "-I", "-S", "-c", _unpack_source()]
    python += ["/workspace", str(max_bytes), str(max_members)]
    argv = [*_unpack_jail(workspace, interpreter), "--", *python]
    if run_as is not None:
        uid, gid = run_as
        drop = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
        argv = [*drop, "--no-new-privs", "--", *argv]
    rlimits = [
        "prlimit",
        f"--as={UNPACK_MEMORY_BYTES}",
        f"--fsize={max(max_bytes, 1)}",
        f"--cpu={UNPACK_SECONDS}",
        "--nofile=64",
        "--core=0",
    ]
    return [*rlimits, "--", *argv]


def _interpreter(other_user: bool) -> Path:
    """The worker's own interpreter (its real path), or, when the child runs as another
    user who cannot reach it (a root worker's under /root), the system's."""
    own = Path(os.path.realpath(sys.executable))
    reachable = _reachable_by_anyone(own) if other_user else os.access(own, os.X_OK)
    system = Path("/usr/bin/python3")
    return own if reachable or not system.exists() else system


def _reachable_by_anyone(path: Path) -> bool:
    try:
        return all(p.stat().st_mode & 0o001 for p in [path, *path.parents])
    except OSError:
        return False


def _unpack_jail(workspace: Path, interpreter: Path) -> list[str]:
    """bubblewrap for the unpacking child: no network, no other process, the system's
    ``/usr`` (and its links) and the interpreter's installation read-only, the workspace
    read-write at ``/workspace``."""
    argv = ["bwrap", "--unshare-all", "--unshare-user", "--disable-userns"]
    argv += ["--die-with-parent", "--new-session", "--clearenv", "--cap-drop", "ALL"]
    argv += ["--setenv", "LC_ALL", "C.UTF-8", "--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib64", "lib32"):
        if Path(f"/{name}").is_symlink():
            argv += ["--symlink", f"usr/{name}", f"/{name}"]
        elif Path(f"/{name}").is_dir():
            argv += ["--ro-bind", f"/{name}", f"/{name}"]
    # Its prefix: bin/ and lib/pythonX.Y beside each other (pyenv, /usr/local, a venv copy).
    home = interpreter.parent.parent
    if not home.is_relative_to("/usr"):
        argv += ["--ro-bind", str(home), str(home)]
    argv += ["--dev", "/dev"]  # no /tmp: nothing to write but the workspace
    return [*argv, "--bind", str(workspace), "/workspace", "--chdir", "/"]


@functools.cache
def _unpack_source() -> str:
    return Path(unpack.__file__).read_text()


def archive(workspace: Path, target: Path) -> list[str]:
    """Write the workspace as ``workspace/...`` in a gzip-compressed tar to ``target`` (a
    new file, outside the workspace), streamed: the worker holds a block at a time, not
    the archive, nor (``tarfile`` keeps every member it adds) a record per file. Links
    are stored as links, never followed; what cannot be archived (a socket) is left out,
    and so is a file the worker cannot read even after giving itself the owner's read bit
    back (:func:`tiergate.sandbox.owned.unlock`). Returns the names left out."""
    with contextlib.suppress(FileNotFoundError):
        target.unlink()
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    left: list[str] = []
    with (
        os.fdopen(fd, "wb") as out,
        tarfile.open(fileobj=out, mode="w:gz", compresslevel=6) as tar,
    ):
        for path, name in _entries(workspace):
            for attempt in range(2):
                try:
                    tar.add(path, arcname=name, recursive=False)
                    break
                except PermissionError:
                    if attempt or not owned.unlock(path, 0o400):
                        left.append(name)
                        break
                except FileNotFoundError:
                    break  # gone since it was listed
            tar.members.clear()  # type: ignore[attr-defined]  # (not in typeshed)
    return left


def _entries(workspace: Path) -> Iterator[tuple[str, str]]:
    """(path, name in the archive) of the workspace and everything in it, each directory
    before what it holds, in name order, without following links."""
    yield str(workspace), "workspace"
    top = len(str(workspace))
    for entry in owned.Walk(workspace, ordered=True):
        yield entry.path, "workspace" + entry.path[top:]


def workspace_bytes(workspace: Path) -> int:
    """The files' apparent sizes (symbolic links not followed, hard links counted each);
    :class:`SandboxError` when a directory cannot be read (its files would not count)."""
    total = 0
    walk = owned.Walk(workspace)
    for entry in walk:
        if not entry.is_dir(follow_symlinks=False):
            with contextlib.suppress(OSError):
                total += entry.stat(follow_symlinks=False).st_size
    if walk.hidden:
        raise SandboxError(HIDDEN)
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
        except PermissionError:
            if not owned.unlock(src, 0o700):
                left.append(rel or ".")
                return
            walk(src, dst, rel)
            return
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
                    try:
                        shutil.copyfile(entry.path, out, follow_symlinks=False)
                    except PermissionError:
                        if not owned.unlock(entry.path, 0o400):
                            raise
                        shutil.copyfile(entry.path, out, follow_symlinks=False)
                    os.chmod(out, entry.stat(follow_symlinks=False).st_mode & 0o777)
                else:
                    left.append(name)
            except OSError:
                left.append(name)

    walk(source, target, "")
    return left
