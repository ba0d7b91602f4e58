"""Building an environment: mmdebstrap makes a root file system as a tar from Debian's
package archive, the manifest's extra files are appended with fixed metadata, and the
digest is the sha256 of the final tar.

Reproducible: mmdebstrap honours ``SOURCE_DATE_EPOCH`` (file times, and what packages
record of the build time), and the files appended here are sorted, with the epoch as their
time, owner root and fixed modes; so two builds of one manifest against the same state of
the mirror give one digest (see :mod:`tiergate.envs.manifest` for what the mirror moving
means). ``--mode=root`` needs root (it mounts /proc and /dev in the chroot); where the
builder is not root, ``--mode=unshare`` needs unprivileged user namespaces and subuid
ranges for the user (mmdebstrap(1)). Building is the operator's step (``tiergate env
build``, or the Helm chart's Job); workers only fetch and unpack.
"""

from __future__ import annotations

import hashlib
import io
import os
import posixpath
import shutil
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tiergate.envs.manifest import Manifest


class BuildError(Exception):
    """mmdebstrap is missing or failed."""


@dataclass(frozen=True, slots=True)
class Built:
    manifest: Manifest
    path: Path
    digest: str
    bytes: int
    seconds: float


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def mmdebstrap_argv(manifest: Manifest, out: Path, mode: str) -> list[str]:
    argv = ["mmdebstrap", f"--variant={manifest.variant}", f"--mode={mode}", "--format=tar"]
    if manifest.packages:
        argv.append("--include=" + ",".join(sorted(set(manifest.packages))))
    return [*argv, manifest.suite, str(out), manifest.mirror]


def add_files(tar_path: Path, manifest: Manifest) -> None:
    """Append the manifest's files (and parent directories the tar lacks), sorted, with
    fixed time, owner and mode, so the result depends only on the manifest."""
    if not manifest.files:
        return
    with tarfile.open(tar_path) as tar:
        present = {posixpath.normpath(m.name.removeprefix("./") or ".") for m in tar}
    epoch = manifest.source_date_epoch
    with tarfile.open(tar_path, "a", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(manifest.files):
            rel = path.lstrip("/")
            parents = []
            parent = posixpath.dirname(rel)
            while parent and parent not in present:
                parents.append(parent)
                parent = posixpath.dirname(parent)
            for directory in reversed(parents):
                info = _info(f"./{directory}", epoch, 0o755, tarfile.DIRTYPE)
                tar.addfile(info)
                present.add(directory)
            data = manifest.files[path].encode()
            info = _info(f"./{rel}", epoch, 0o644, tarfile.REGTYPE)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            present.add(rel)


def _info(name: str, epoch: int, mode: int, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = kind, mode, epoch
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def build(
    manifest: Manifest, out: Path, mode: str | None = None, log: IO[str] | None = None
) -> Built:
    """Build ``manifest`` into the tar ``out``; mmdebstrap's progress goes to ``log``
    (default stderr). ``mode``: mmdebstrap's, default ``root`` as root, else ``unshare``."""
    if shutil.which("mmdebstrap") is None:
        raise BuildError("mmdebstrap is not installed (apt-get install mmdebstrap)")
    mode = mode or ("root" if os.geteuid() == 0 else "unshare")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    partial.unlink(missing_ok=True)
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(manifest.source_date_epoch)}
    started = time.monotonic()
    try:
        proc = subprocess.run(
            mmdebstrap_argv(manifest, partial, mode),
            env=env,
            stdin=subprocess.DEVNULL,
            # Progress to stderr (fd 2 itself: sys.stderr may be a wrapper without one).
            stdout=log if log is not None else 2,
            stderr=log,
            check=False,
        )
        if proc.returncode != 0:
            raise BuildError(f"mmdebstrap failed (exit {proc.returncode})")
        add_files(partial, manifest)
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    seconds = time.monotonic() - started
    return Built(manifest, out, sha256_file(out), out.stat().st_size, seconds)
