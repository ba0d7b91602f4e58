"""Tar archives built in memory, for workspace tests."""

from __future__ import annotations

import io
import tarfile


def tar_of(files: dict[str, bytes], mode: str = "w") -> bytes:
    """An archive of ``files`` (name -> content); ``mode`` ``"w:gz"`` compresses it."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
