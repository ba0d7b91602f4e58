"""The local stack's directories that hold tenants' data (jobs, uploads, batches, answers)
and logs (prompts and errors quoted in them): readable by their owner alone, whatever the
umask, and made so again when an older run left them open."""

from __future__ import annotations

from pathlib import Path

PRIVATE_MODE = 0o700


def private_dir(path: Path) -> Path:
    """``path``, created if missing, with mode 0700: another local user can neither list
    it nor reach anything under it."""
    path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_MODE)
    path.chmod(PRIVATE_MODE)
    return path
