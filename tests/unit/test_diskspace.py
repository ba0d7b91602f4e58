"""The free-space check: each filesystem once, SeaweedFS's floor plus the margin, and the
local stack refusing to start, saying where, before it starts anything."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tiergate.measure.diskspace import (
    GIB,
    check_stack_disks,
    disk_space,
    low_disk_message,
    stack_needs,
)
from tiergate.settings import Settings
from tiergate.stack import run_local_stack


def test_each_filesystem_is_checked_once_against_the_floor_and_the_margin(
    tmp_path: Path,
) -> None:
    not_yet = tmp_path / "not" / "made" / "yet"  # checked on the ancestor it will be made on
    checked = check_stack_disks([tmp_path, not_yet], 2.0)
    assert len(checked) == 1
    total = shutil.disk_usage(tmp_path).total
    assert checked[0].needed == stack_needs(total, 2.0) == int(total * 0.01) + 2 * GIB
    assert checked[0].path == tmp_path
    assert not not_yet.exists()


def test_a_short_disk_is_named_with_what_it_has_and_needs(tmp_path: Path) -> None:
    free = disk_space(tmp_path, 0).free
    plenty = check_stack_disks([tmp_path], 0.0)
    short = check_stack_disks([tmp_path], free / GIB + 1.0)  # a GiB more than there is
    assert not short[0].ok
    message = low_disk_message(short)
    assert message is not None
    assert str(tmp_path) in message and "GiB free" in message and "--min-free-gib" in message
    if plenty[0].ok:  # a disk past 99% full fails even with no margin: that is the floor
        assert low_disk_message(plenty) is None


def test_the_stack_refuses_to_start_on_a_short_disk_before_starting_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TIERGATE_CACHE_DIR", str(tmp_path / "cache"))
    code = run_local_stack(
        Settings(), jobs=False, default_environment=None, min_free_gib=1_000_000.0
    )
    assert code == 1
    said = capsys.readouterr()
    assert "not enough free disk space to start" in said.out + said.err
    assert not (tmp_path / "cache").exists()  # nothing was prepared, started or written
