"""Makes the archive bombs beside this file (committed, since the 4 GiB one takes about 20 s
to compress): ``python tests/data/bombs/make.py``.

- ``bz2-512m.tar.bz2``: one member of 512 MiB of zeros (463 bytes; the issue's bomb);
- ``bz2-4g.tar.bz2``: one member of 4 GiB of zeros (about 3 KB);
- ``xz-bigdict.tar.xz``: 64 MiB of zeros in xz whose block header claims a 3 GiB
  dictionary (compressed with 1 MiB, the claim patched in and the header's CRC32 redone):
  decoders that honour it reserve that much.
"""

from __future__ import annotations

import bz2
import lzma
import struct
import tarfile
import zlib
from pathlib import Path

MiB = 1024 * 1024
HERE = Path(__file__).parent


def _header(size: int) -> bytes:
    info = tarfile.TarInfo("zeros")
    info.size = size
    return info.tobuf(format=tarfile.GNU_FORMAT)


def bz2_zeros(size: int) -> bytes:
    comp = bz2.BZ2Compressor(9)
    out = [comp.compress(_header(size))]
    zeros = bytes(MiB)
    out += [comp.compress(zeros) for _ in range(size // MiB)]
    out += [comp.compress(bytes(1024)), comp.flush()]
    return b"".join(out)


def xz_big_dictionary() -> bytes:
    raw = _header(64 * MiB) + bytes(64 * MiB) + bytes(1024)
    filters = [{"id": lzma.FILTER_LZMA2, "dict_size": MiB}]
    packed = lzma.compress(raw, format=lzma.FORMAT_XZ, filters=filters)
    size = (packed[12] + 1) * 4  # the block header, after the 12-byte stream header
    block = bytearray(packed[12 : 12 + size])
    assert block[1] == 0 and block[2:4] == b"\x21\x01"  # no size fields; LZMA2, 1 byte
    block[4] = 40  # the dictionary size's code: 3 GiB
    block[-4:] = struct.pack("<I", zlib.crc32(bytes(block[:-4])))
    return packed[:12] + bytes(block) + packed[12 + size :]


if __name__ == "__main__":
    (HERE / "bz2-512m.tar.bz2").write_bytes(bz2_zeros(512 * MiB))
    (HERE / "bz2-4g.tar.bz2").write_bytes(bz2_zeros(4096 * MiB))
    (HERE / "xz-bigdict.tar.xz").write_bytes(xz_big_dictionary())
