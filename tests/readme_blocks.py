"""The code blocks of the README and of the manual in docs/ marked for tests
(``<!-- readme-test: NAME -->`` on the line before the fence; a name is used once across
them), and running them as a reader would: bash with the venv's commands on
PATH, Python with the venv's interpreter, JavaScript with Node.js and the official ``openai``
package that ``make test`` installs in clients/node (a module file in the block's folder,
beside a link to its ``node_modules``), the gateway's address in ``TIERGATE_BASE_URL``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def documents() -> list[Path]:
    """The README and every page of the manual."""
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


VENV_BIN = Path(sys.executable).parent
NODE_MODULES = ROOT / "clients" / "node" / "node_modules"


def readme_block(name: str) -> tuple[str, str]:
    """(language, code) of the block marked ``name``."""
    pattern = re.compile(
        rf"^<!-- readme-test: {re.escape(name)} -->\n```(\w+)\n(.*?)^```$", re.S | re.M
    )
    found = [m for doc in documents() for m in pattern.finditer(doc.read_text())]
    assert len(found) == 1, f"{len(found)} blocks marked readme-test: {name} (README, docs/)"
    return found[0].group(1), found[0].group(2)


def run_readme_block(
    name: str, base_url: str, cwd: Path, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """Run a block as written, but against ``base_url`` instead of ``make up``'s address."""
    language, code = readme_block(name)
    code = code.replace("http://127.0.0.1:8000", base_url)
    if language == "javascript":
        assert (NODE_MODULES / "openai").is_dir(), f"{NODE_MODULES}: run scripts/bootstrap.sh"
        (cwd / "block.mjs").write_text(code)
        if not (cwd / "node_modules").exists():
            (cwd / "node_modules").symlink_to(NODE_MODULES)
    command = {
        "bash": ["bash", "-c", code],
        "python": [sys.executable, "-c", code],
        "javascript": ["node", "block.mjs"],
    }[language]
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "TIERGATE_BASE_URL": base_url,
    }
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def assert_node_batch_guide(stdout: str) -> None:
    """What the manual says the Node Batch API example (batch-node) prints."""
    said = stdout.splitlines()
    assert said[0] == 'completed {"total":3,"completed":2,"failed":1}', said
    assert sorted(said[1:4]) == ["request-1 200", "request-2 200", "request-3 400"], said
    assert said[4] == "listed true", said
    assert said[5] in ("cancel cancelling", "cancel cancelled"), said
