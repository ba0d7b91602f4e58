"""The gateway's upload check (tiergate/gateway/jobs/tarcheck.py): the same verdict as tarfile on
ordinary archives, and bounded memory and work on the bombs of issue 33 (the archives are
in tests/data/bombs, made by its make.py)."""

from __future__ import annotations

import io
import tarfile
import threading
import tracemalloc
from pathlib import Path

import pytest

from tiergate.gateway.jobs.tarcheck import (
    MAX_META_BYTES,
    ArchiveRefused,
    CheckLimits,
    CheckStopped,
    check_tar,
)

BOMBS = Path(__file__).resolve().parents[1] / "data" / "bombs"
MiB = 1024 * 1024
GiB = 1024 * MiB
DEFAULT = CheckLimits(max_members=20_000, max_unpacked=4 * GiB, max_ratio=1000, seconds=60)


def _archive(mode: str, fmt: int = tarfile.PAX_FORMAT) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode, format=fmt) as tar:
        for name, data in [("a.txt", b"hello\n"), ("d/" + "n" * 300, b"x" * 70_000)]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        folder = tarfile.TarInfo("d")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
        link = tarfile.TarInfo("l")
        link.type, link.linkname = tarfile.SYMTYPE, "a.txt"
        tar.addfile(link)
    return buffer.getvalue()


def _check(data: bytes, limits: CheckLimits = DEFAULT) -> tuple[int, int]:
    summary = check_tar(io.BytesIO(data), limits, threading.Event())
    return summary.members, summary.unpacked_bytes


@pytest.mark.parametrize("mode", ["w", "w:gz", "w:bz2", "w:xz"])
@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
def test_ordinary_archives_are_counted_as_tarfile_counts_them(mode: str, fmt: int) -> None:
    data = _archive(mode, fmt)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = tar.getmembers()
    expected = (len(members), sum(m.size for m in members if m.isreg()))
    assert _check(data) == expected == (4, 70_006)


def _refused(data: bytes, limits: CheckLimits = DEFAULT) -> ArchiveRefused:
    with pytest.raises(ArchiveRefused) as caught:
        _check(data, limits)
    return caught.value


def _peak(data: bytes, limits: CheckLimits = DEFAULT) -> tuple[ArchiveRefused, int]:
    tracemalloc.start()
    try:
        refused = _refused(data, limits)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return refused, peak


def test_the_bz2_bomb_of_512_mib_is_refused_in_a_few_mib() -> None:
    """The issue's 463-byte upload: tarfile's stream mode held +0.6-1.0 GB for minutes."""
    bomb = (BOMBS / "bz2-512m.tar.bz2").read_bytes()
    assert len(bomb) < 1024
    refused, peak = _peak(bomb)
    assert refused.code == "upload_ratio_exceeded", refused
    assert "jobs.max_upload_ratio: 1000" in str(refused)
    assert peak < 8 * MiB, f"peak {peak / MiB:.1f} MiB"


def test_a_bz2_claiming_4_gib_is_refused_by_its_header_or_its_ratio() -> None:
    bomb = (BOMBS / "bz2-4g.tar.bz2").read_bytes()
    below = CheckLimits(max_members=10, max_unpacked=GiB, max_ratio=1000, seconds=60)
    assert _refused(bomb, below).code == "upload_too_large_unpacked"  # from the header alone
    refused, peak = _peak(bomb)  # 4 GiB is within the default cap: the ratio stops it
    assert refused.code == "upload_ratio_exceeded" and peak < 8 * MiB, (refused, peak)


def test_the_decompressed_stream_is_capped_whatever_the_headers_say() -> None:
    """Metadata headers count for no member and no size: a chain of 900 KiB PAX headers
    is still ended by the cap on the decompressed stream (the unpacked limit plus the
    members' framing), with no ratio bound to help."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:bz2", format=tarfile.PAX_FORMAT) as tar:
        for i in range(50):
            info = tarfile.TarInfo(f"f{i}")
            info.pax_headers = {"comment": "c" * (900 * 1024)}
            tar.addfile(info)
    limits = CheckLimits(max_members=1000, max_unpacked=1024, max_ratio=1e12, seconds=60)
    refused, peak = _peak(buffer.getvalue(), limits)
    assert refused.code == "upload_too_large_unpacked", refused
    assert peak < 8 * MiB


def test_an_xz_that_claims_a_huge_dictionary_is_refused_without_allocating_it() -> None:
    bomb = (BOMBS / "xz-bigdict.tar.xz").read_bytes()
    refused, peak = _peak(bomb)
    assert refused.code == "invalid_upload" and "xz -8 or less" in str(refused), refused
    assert peak < 8 * MiB


def test_a_pax_size_counts_and_a_huge_pax_header_is_refused() -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("big")
        info.size = 2 * MiB
        tar.addfile(info, io.BytesIO(bytes(2 * MiB)))
    small = CheckLimits(max_members=10, max_unpacked=MiB, max_ratio=1000, seconds=60)
    assert _refused(buffer.getvalue(), small).code == "upload_too_large_unpacked"

    huge = tarfile.TarInfo("x")
    huge.pax_headers = {"comment": "c" * (MAX_META_BYTES + 10)}
    data = huge.tobuf(format=tarfile.PAX_FORMAT) + bytes(1024)
    assert "tar metadata header" in str(_refused(data))


def test_members_over_the_limit_and_broken_archives_are_refused() -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for i in range(11):
            tar.addfile(tarfile.TarInfo(f"f{i}"))
    few = CheckLimits(max_members=10, max_unpacked=MiB, max_ratio=1000, seconds=60)
    assert _refused(buffer.getvalue(), few).code == "upload_too_many_members"
    good = _archive("w:gz")
    assert _refused(good[: len(good) // 2]).code == "invalid_upload"  # cut short
    assert _refused(b"not a tar at all" * 100).code == "invalid_upload"
    assert "no members" in str(_refused(bytes(10240)))


def test_a_cancelled_or_slow_check_stops() -> None:
    data = _archive("w")
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(CheckStopped):
        check_tar(io.BytesIO(data), DEFAULT, cancel)
    big = io.BytesIO()
    with tarfile.open(fileobj=big, mode="w") as tar:
        info = tarfile.TarInfo("big")
        info.size = 8 * MiB
        tar.addfile(info, io.BytesIO(bytes(8 * MiB)))
    hurried = CheckLimits(max_members=10, max_unpacked=GiB, max_ratio=1000, seconds=1e-9)
    refused = _refused(big.getvalue(), hurried)
    assert refused.code == "upload_check_timeout" and "jobs.upload_check_seconds" in str(refused)
