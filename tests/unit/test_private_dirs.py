"""The local stack's data and log directories are their owner's alone
(tiergate.local.private): attacker's test, for a local user who could read every tenant's
jobs, uploads and logs under directories created 0755."""

from __future__ import annotations

import os
from pathlib import Path

from tiergate.local.private import private_dir


def test_a_new_directory_is_private_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        made = private_dir(tmp_path / "cache" / "pipeline")
    finally:
        os.umask(old)
    assert made.stat().st_mode & 0o777 == 0o700


def test_a_directory_an_older_run_left_open_is_closed(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o755)
    logs.chmod(0o755)
    (logs / "gateway.log").write_text("a tenant's prompt")
    private_dir(logs)
    assert logs.stat().st_mode & 0o777 == 0o700
