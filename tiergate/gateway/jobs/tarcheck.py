"""The upload check of a workspace archive, at a cost the gateway bounds whatever the archive
claims.

Why not ``tarfile``'s own stream mode: its decompressors are called without ``max_length``,
so a few kilobytes of bzip2 hand back a whole member of zeros at once (512 MiB from 458
bytes), and its stream buffer is copied for every read: one small upload held a replica
at +1 GB for minutes. Here the archive is decompressed in chunks of at most
:data:`CHUNK_BYTES` (``max_length``), xz under a memory limit for its dictionary
(:data:`XZ_MEMORY_BYTES`), and the tar framing is walked a 512-byte header at a time, each
header parsed by ``tarfile.TarInfo.frombuf`` (checksums, number formats and encodings are
the standard library's); member data is skipped, never kept. Metadata headers (PAX,
GNU long names) are the only thing held whole, at most :data:`MAX_META_BYTES` each.

The work is bounded three ways, each refused with its setting named (400):
- the decompressed stream: at most ``max_unpacked`` plus the tar framing of
  ``max_members`` members;
- its ratio to the compressed bytes read (``jobs.max_upload_ratio``, past the first
  :data:`RATIO_FREE_BYTES`): a bzip2 of zeros compresses a million to one, real
  workspaces ten to one;
- wall-clock time (``jobs.upload_check_seconds``), and a ``cancel`` event checked between
  chunks: a client that has gone, or a gateway shutting down, stops the check within one
  chunk.
"""

from __future__ import annotations

import bz2
import lzma
import tarfile
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Protocol

CHUNK_BYTES = 1024 * 1024
READ_BYTES = 64 * 1024
# xz -8 needs 33 MiB to decompress (a 32 MiB dictionary), -9 65 MiB; the default, -6, 9.
XZ_MEMORY_BYTES = 40 * 1024 * 1024
MAX_META_BYTES = 1024 * 1024
RATIO_FREE_BYTES = 16 * 1024 * 1024
_BLOCK = tarfile.BLOCKSIZE
# A member's framing: its header, a PAX header and its record, a GNU long name and link
# (a block each, plus their data up to a block past the name), and the padding of its data.
_FRAMING_PER_MEMBER = 8 * _BLOCK
_END_BYTES = tarfile.RECORDSIZE * 2
_META_TYPES = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)
_GNU_NAMES = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)


class ArchiveRefused(Exception):
    """The archive is not one to accept: ``code`` is the error code, the message says why."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class CheckStopped(Exception):
    """The check was cancelled (the client left, or the gateway is stopping)."""


@dataclass(frozen=True, slots=True)
class CheckLimits:
    max_members: int
    max_unpacked: int
    max_ratio: float
    seconds: float


@dataclass(frozen=True, slots=True)
class TarSummary:
    members: int
    unpacked_bytes: int


class _Decompressor(Protocol):
    @property
    def eof(self) -> bool: ...
    @property
    def unused_data(self) -> bytes: ...
    @property
    def needs_input(self) -> bool: ...
    def decompress(self, data: bytes, max_length: int = ...) -> bytes: ...


class _Zlib:
    """zlib's decompressobj behind the interface bz2 and lzma share (``needs_input``)."""

    def __init__(self) -> None:
        self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip framing only

    @property
    def eof(self) -> bool:
        return self._d.eof

    @property
    def unused_data(self) -> bytes:
        return self._d.unused_data

    @property
    def needs_input(self) -> bool:
        return not self._d.unconsumed_tail

    def decompress(self, data: bytes, max_length: int = -1) -> bytes:
        if not data:
            data = self._d.unconsumed_tail
        return self._d.decompress(data, max(max_length, 0))


def _xz() -> _Decompressor:
    return lzma.LZMADecompressor(lzma.FORMAT_XZ, memlimit=XZ_MEMORY_BYTES)


_KINDS: tuple[tuple[bytes, Callable[[], _Decompressor]], ...] = (
    (b"\x1f\x8b", _Zlib),
    (b"BZh", bz2.BZ2Decompressor),
    (b"\xfd7zXZ\x00", _xz),
)


class _Stream:
    """The archive's tar bytes, decompressed at most ``CHUNK_BYTES`` at a time, counted
    against the limits as they come."""

    def __init__(self, file: IO[bytes], limits: CheckLimits, cancel: threading.Event) -> None:
        self._file = file
        self._limits = limits
        self._cancel = cancel
        self._deadline = time.monotonic() + limits.seconds
        head = file.read(8)
        self._pending = head
        self._make = next((make for magic, make in _KINDS if head.startswith(magic)), None)
        self._decompressor = None if self._make is None else self._make()
        self._buffer = bytearray()
        self.read_bytes = len(head)
        self.out_bytes = 0
        self._cap = limits.max_unpacked + limits.max_members * _FRAMING_PER_MEMBER + _END_BYTES
        self._ended = False

    def take(self, size: int) -> bytes:
        """Exactly ``size`` bytes (fewer only at the stream's end)."""
        while len(self._buffer) < size and not self._ended:
            self._fill()
        out = bytes(self._buffer[:size])
        del self._buffer[:size]
        return out

    def skip(self, size: int) -> bool:
        """Pass over ``size`` bytes without keeping them; False if the stream ended first."""
        while size > 0:
            if not self._buffer:
                if self._ended:
                    return False
                self._fill()
                continue
            step = min(size, len(self._buffer))
            del self._buffer[:step]
            size -= step
        return True

    def _fill(self) -> None:
        if self._cancel.is_set():
            raise CheckStopped
        if time.monotonic() > self._deadline:
            raise ArchiveRefused(
                f"The upload could not be checked within {self._limits.seconds:g} seconds "
                "(jobs.upload_check_seconds).",
                "upload_check_timeout",
            )
        chunk = self._next_chunk()
        if chunk is None:
            self._ended = True
            return
        self.out_bytes += len(chunk)
        self._buffer += chunk
        self._bound()

    def _next_chunk(self) -> bytes | None:
        if self._decompressor is None or self._make is None:
            data = self._pending
            self._pending = b""
            if not data:
                data = self._file.read(CHUNK_BYTES)
                self.read_bytes += len(data)
            return data or None
        while True:
            d = self._decompressor
            if d.eof:
                fresh = self._file.read(READ_BYTES)
                self.read_bytes += len(fresh)
                rest = d.unused_data + self._pending + fresh
                self._pending = b""
                if not rest.strip(b"\0"):
                    return None  # the end (trailing zeros after a stream are padding)
                self._decompressor = d = self._make()  # a concatenated stream
                self._pending = rest
            data = b""
            if d.needs_input:
                data = self._pending
                self._pending = b""
                if not data:
                    data = self._file.read(READ_BYTES)
                    self.read_bytes += len(data)
                if not data:
                    raise _unreadable()  # cut short inside a compressed stream
            out = d.decompress(data, CHUNK_BYTES)
            if out:
                return out

    def _bound(self) -> None:
        limits = self._limits
        if self.out_bytes > self._cap:
            raise _too_large_unpacked(limits.max_unpacked)
        if self.out_bytes > RATIO_FREE_BYTES and self.out_bytes > limits.max_ratio * max(
            self.read_bytes, 1
        ):
            raise ArchiveRefused(
                f"The upload decompresses to more than {limits.max_ratio:g} times its size, "
                f"this installation's limit (jobs.max_upload_ratio: {limits.max_ratio:g}).",
                "upload_ratio_exceeded",
            )


def _unreadable() -> ArchiveRefused:
    return ArchiveRefused(
        "The upload is not a readable tar archive (plain, or gzip, bzip2 or xz compressed).",
        "invalid_upload",
    )


def _too_large_unpacked(limit: int) -> ArchiveRefused:
    return ArchiveRefused(
        f"The upload unpacks to more than {limit} bytes, over this installation's limit "
        f"(jobs.max_upload_unpacked_bytes: {limit}).",
        "upload_too_large_unpacked",
    )


def _blocks(size: int) -> int:
    return -(-size // _BLOCK) * _BLOCK


def _pax_size(record: bytes, current: int | None) -> int | None:
    """The ``size`` keyword of a PAX header's records, if any (else ``current``)."""
    pos = 0
    while pos < len(record):
        space = record.find(b" ", pos)
        if space < 0 or not record[pos:space].isdigit():
            if record[pos:].strip(b"\0\n") == b"":
                break
            raise _unreadable()
        length = int(record[pos:space])
        if length <= space - pos or pos + length > len(record):
            raise _unreadable()
        key, _, value = record[space + 1 : pos + length - 1].partition(b"=")
        if key == b"size":
            if not value.isdigit():
                raise _unreadable()
            current = int(value)
        pos += length
    return current


def check_tar(file: IO[bytes], limits: CheckLimits, cancel: threading.Event) -> TarSummary:
    """Walk the archive in ``file`` from its start; refuse it (:class:`ArchiveRefused`) when
    it is not a tar (plain, gzip, bzip2 or xz), has more than ``limits.max_members``
    members, their sizes sum to more than ``limits.max_unpacked``, or it breaks a bound of
    the module docstring. :class:`CheckStopped` once ``cancel`` is set."""
    file.seek(0)
    try:
        stream = _Stream(file, limits, cancel)
        return _walk(stream, limits)
    except (EOFError, OSError, ValueError, zlib.error, lzma.LZMAError) as exc:
        if isinstance(exc, lzma.LZMAError) and "memory" in str(exc).lower():
            raise ArchiveRefused(
                "The upload's xz stream needs more than "
                f"{XZ_MEMORY_BYTES // (1024 * 1024)} MiB to decompress (its dictionary); "
                "compress it with a smaller preset (xz -8 or less).",
                "invalid_upload",
            ) from None
        raise _unreadable() from None


def _walk(stream: _Stream, limits: CheckLimits) -> TarSummary:
    members = unpacked = 0
    pax_global: int | None = None
    pax_next: int | None = None
    while True:
        block = stream.take(_BLOCK)
        if not block or block.count(0) == _BLOCK:
            break  # the end-of-archive block (or the stream's end after whole members)
        try:
            info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        except tarfile.HeaderError:
            raise _unreadable() from None
        if info.type in _META_TYPES or info.type in _GNU_NAMES:
            if info.size > MAX_META_BYTES:
                raise ArchiveRefused(
                    f"The upload has a tar metadata header of {info.size} bytes, over "
                    f"{MAX_META_BYTES} (a PAX header or a long name).",
                    "invalid_upload",
                )
            data = stream.take(_blocks(info.size))
            if len(data) < _blocks(info.size):
                raise _unreadable()
            if info.type == tarfile.XGLTYPE:
                pax_global = _pax_size(data[: info.size], pax_global)
            elif info.type in _META_TYPES:
                pax_next = _pax_size(data[: info.size], pax_next)
            continue
        if info.type == tarfile.GNUTYPE_SPARSE:
            raise ArchiveRefused(
                "The upload has a GNU sparse member, which workspaces do not take "
                "(archive it without --sparse).",
                "invalid_upload",
            )
        size = pax_next if pax_next is not None else pax_global
        size = info.size if size is None else size
        pax_next = None
        members += 1
        if members > limits.max_members:
            raise ArchiveRefused(
                f"The upload has more than {limits.max_members} members, over this "
                f"installation's limit (jobs.max_upload_members: {limits.max_members}).",
                "upload_too_many_members",
            )
        has_data = info.isreg() or info.type not in tarfile.SUPPORTED_TYPES
        if has_data:
            unpacked += max(size, 0)
            if unpacked > limits.max_unpacked:
                raise _too_large_unpacked(limits.max_unpacked)
            if not stream.skip(_blocks(size)):
                raise _unreadable()
    if members == 0:
        raise ArchiveRefused("The upload is a tar archive with no members.", "invalid_upload")
    return TarSummary(members, unpacked)
