"""The README's code blocks marked for tests (``<!-- readme-test: NAME -->`` on the line
before the fence), and running them as a reader would: bash with the venv's commands on
PATH, Python with the venv's interpreter, the gateway's address in ``TIERGATE_BASE_URL``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
VENV_BIN = Path(sys.executable).parent


def readme_block(name: str) -> tuple[str, str]:
    """(language, code) of the block marked ``name``."""
    found = re.search(
        rf"^<!-- readme-test: {re.escape(name)} -->\n```(\w+)\n(.*?)^```$",
        README.read_text(),
        re.S | re.M,
    )
    assert found, f"the README has no block marked readme-test: {name}"
    return found.group(1), found.group(2)


def run_readme_block(
    name: str, base_url: str, cwd: Path, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """Run a block as written, but against ``base_url`` instead of ``make up``'s address."""
    language, code = readme_block(name)
    code = code.replace("http://127.0.0.1:8000", base_url)
    command = {"bash": ["bash", "-c", code], "python": [sys.executable, "-c", code]}[language]
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "TIERGATE_BASE_URL": base_url,
    }
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
