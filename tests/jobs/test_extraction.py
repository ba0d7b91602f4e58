"""A tenant's workspace archive, written as the attacker would (issue 33, item 2): links out
of the workspace, writes through a link an earlier member made, hard links to what is not
the archive's own file, special files, and the layouts that beat ``tarfile``'s own filter
on interpreters without the fix for CVE-2025-4517. Each is refused and writes nothing
outside the workspace, on a root worker (the job slot's uid) and on a non-root one (the
chart's: the child runs as the worker's own uid, which other workspaces share), and code
running in the unpacking child, as a parser bug would, can write the workspace alone.
Real bubblewrap; the non-root cases run as uid 65534 in a process of their own."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.jobs.unprivileged import NOBODY, REPO, run_as_nobody
from tiergate.jobsettings import SandboxSettings
from tiergate.protocol import JobLimits
from tiergate.sandbox import Sandbox, SandboxError
from tiergate.sandbox import files as sandbox_files

ROOT = os.geteuid() == 0
WORK = "/tmp/tiergate-sandboxes/extraction"

Member = tuple[str, str, bytes | str]  # (kind, name, data or link target)


def archive(*members: Member) -> bytes:
    """A tar of ``members``: ("file", name, data), ("dir", name, ""), ("sym", name,
    target), ("hard", name, target), ("fifo", name, ""), ("dev", name, "")."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for kind, name, data in members:
            info = tarfile.TarInfo(name)
            content = None
            if kind == "file":
                assert isinstance(data, bytes)
                info.size, content = len(data), io.BytesIO(data)
            elif kind == "dir":
                info.type = tarfile.DIRTYPE
            elif kind in ("sym", "hard"):
                assert isinstance(data, str)
                info.type = tarfile.SYMTYPE if kind == "sym" else tarfile.LNKTYPE
                info.linkname = data
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
            else:
                info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
            tar.addfile(info, content)
    return buffer.getvalue()


def _deep_chain(target: str) -> list[Member]:
    """The public CVE-2025-4517 proof of concept (CPython gh-135034): directories with
    long names and a chain of links whose real path runs past PATH_MAX, so that
    ``realpath`` stops resolving and the data filter judges a path that is not the one
    written; ``escape`` then names the workspace's parent, a hard link reaches ``target``
    through it, and a file of the link's name writes into ``target``. Against this
    project's earlier unpacker (``filter="data"``) on Python 3.11.7 it overwrote the file
    outside the workspace."""
    comp = "d" * 247
    steps = "abcdefghijklmnop"
    members: list[Member] = []
    path = ""
    for step in steps:
        members.append(("dir", path + comp, ""))
        members.append(("sym", path + step, comp))
        path += comp + "/"
    linkpath = "/".join(steps) + "/" + "l" * 254
    members.append(("sym", linkpath, "../" * len(steps)))
    members.append(("sym", "escape", linkpath + "/../"))
    members.append(("hard", "flaglink", "escape/" + target))
    members.append(("file", "flaglink", b"pwned"))
    return members


ATTACKS: dict[str, tuple[list[Member], str]] = {
    "absolute name": ([("file", "/tmp/planted", b"x")], "outside the workspace"),
    "dot-dot name": ([("file", "../planted", b"x")], "outside the workspace"),
    "absolute link": ([("sym", "l", "/etc")], "link out of the workspace"),
    "dot-dot link": ([("sym", "sub/l", "../../..")], "link out of the workspace"),
    "write through an earlier link": (
        [("sym", "d", "."), ("file", "d/x", b"1")],
        "below a link or a file",
    ),
    "link to a link, then write through it": (
        [("sym", "s", "."), ("sym", "t", "s/.."), ("file", "t/planted", b"x")],
        "below a link or a file",
    ),
    "hard link out": ([("hard", "h", "../../outside/target")], "outside the workspace"),
    "hard link to a system file": ([("hard", "h", "etc/passwd")], "not an earlier file"),
    "hard link to a link": (
        [("sym", "s", "a"), ("file", "a", b"x"), ("hard", "h", "s")],
        "not an earlier file",
    ),
    "file replaced by a link, then hard-linked": (
        [("file", "f", b"x"), ("sym", "f", "."), ("hard", "h", "f")],
        "hard link to what is not a file",
    ),
    "fifo": ([("fifo", "p", "")], "special file"),
    "device": ([("dev", "null", "")], "special file"),
}


@pytest.fixture
def box() -> Iterator[Sandbox]:
    sandbox = Sandbox(f"x{uuid.uuid4().hex[:8]}", JobLimits(), SandboxSettings(work_dir=WORK))
    yield sandbox
    sandbox.close()


def _outside(box: Sandbox) -> Path:
    """A directory beside the workspace that holds a file an escape would overwrite."""
    outside = box.root / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "target").write_text("untouched")
    if ROOT:  # the job's uid may write both, as a non-root worker's jobs all may
        for path in (outside, outside / "target"):
            shutil.chown(path, box._settings.uid, box._settings.gid)
    return outside


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_each_hostile_member_is_refused_and_writes_nothing_outside(
    box: Sandbox, attack: str
) -> None:
    members, why = ATTACKS[attack]
    outside = _outside(box)
    with pytest.raises(SandboxError, match=why) as refused:
        box.extract(archive(*members))
    assert str(box.root) not in str(refused.value)
    assert (outside / "target").read_text() == "untouched"
    assert sorted(p.name for p in outside.iterdir()) == ["target"]
    if why != "below a link or a file" and attack != "file replaced by a link, then hard-linked":
        # Judged from the headers alone: nothing unpacked. What an earlier member made
        # on disk is seen as it is written (the job then fails, its workspace removed).
        assert not any(box.workspace.iterdir()), "refused at the headers: nothing unpacked"


def test_the_cve_2025_4517_layout_writes_nothing_outside(box: Sandbox) -> None:
    outside = _outside(box)
    with pytest.raises(SandboxError):
        box.extract(archive(*_deep_chain("outside/target")))
    assert (outside / "target").read_text() == "untouched"
    assert sorted(p.name for p in outside.iterdir()) == ["target"]


def test_an_ordinary_archive_with_links_unpacks_as_tar_would(box: Sandbox) -> None:
    box.extract(
        archive(
            ("dir", "src", ""),
            ("file", "src/main.py", b"print(1)\n"),
            ("sym", "main.py", "src/main.py"),
            ("hard", "copy.py", "src/main.py"),
            ("file", "top.txt", b"old"),
            ("file", "top.txt", b"new"),  # a later member of the same name replaces it
            ("file", "deep/er/file", b"x"),
        )
    )
    ws = box.workspace
    assert (ws / "main.py").is_symlink() and os.readlink(ws / "main.py") == "src/main.py"
    assert (ws / "copy.py").stat().st_ino == (ws / "src/main.py").stat().st_ino
    assert (ws / "top.txt").read_bytes() == b"new"
    assert (ws / "deep/er").stat().st_mode & 0o777 == 0o755
    assert box.run("cat main.py copy.py deep/er/file", timeout=20).output == "print(1)\n" * 2 + "x"


def test_code_in_the_unpacking_child_can_write_the_workspace_alone(tmp_path: Path) -> None:
    """As a parser bug would: the child's own code tries the worker's files, a sibling
    workspace and the host's /tmp. Only its workspace takes the write."""
    base = Path(tempfile.mkdtemp(prefix="tiergate-jail-", dir="/tmp"))
    try:
        workspace, sibling = base / "ws", base / "other"
        for path in (workspace, sibling):
            path.mkdir()
        evil = (
            "import sys\n"
            "for target in sys.argv[1:]:\n"
            "    try:\n"
            "        open(target, 'w').write('x'); print('wrote', target)\n"
            "    except OSError as exc:\n"
            "        print('refused', target, exc.errno)\n"
        )
        interpreter = sandbox_files._interpreter(False)
        jail = sandbox_files._unpack_jail(workspace, interpreter)
        targets = [f"{sibling}/planted", f"{base}/planted", "/tmp/planted-by-unpack"]
        targets += [f"{REPO}/planted", "/workspace/ok"]
        done = subprocess.run(
            [*jail, "--", str(interpreter), "-I", "-S", "-c", evil, *targets],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        wrote = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("wrote")]
        assert wrote == ["/workspace/ok"], done.stdout
        assert (workspace / "ok").exists() and not (sibling / "planted").exists()
        assert not (base / "planted").exists() and not (REPO / "planted").exists()
        assert not Path("/tmp/planted-by-unpack").exists()
    finally:
        shutil.rmtree(base)


_AS_NOBODY = r"""
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from tests.jobs.test_extraction import ATTACKS, archive, _deep_chain
from tiergate.sandbox import files, owned, SandboxError
base = Path(sys.argv[2])
cases = {name: members for name, (members, _) in ATTACKS.items()}
cases["cve-2025-4517"] = _deep_chain("outside/target")
out = {}
for name, members in cases.items():
    ws, source = base / "ws", base / "upload.tar"
    ws.mkdir()
    source.write_bytes(archive(*members))
    try:
        with source.open("rb") as stream:
            files.extract(ws, stream, 10**8, 10**5, None)
        out[name] = "unpacked"
    except SandboxError as exc:
        out[name] = str(exc)
    owned.remove_tree(ws)
print(json.dumps(out))
"""


@pytest.mark.skipif(not ROOT, reason="needs root to become uid 65534 (CI runs as root)")
def test_a_non_root_worker_refuses_the_same_archives() -> None:
    """The chart's workers run as a uid of their own that every job shares: the same
    attacks, with the child as that uid, leave the sibling directory untouched."""
    base = Path(tempfile.mkdtemp(prefix="tiergate-unpriv-x-", dir="/tmp"))
    try:
        os.chown(base, NOBODY, NOBODY)
        outside = base / "outside"
        outside.mkdir()
        (outside / "target").write_text("untouched")
        for path in (outside, outside / "target"):
            os.chown(path, NOBODY, NOBODY)
        verdicts = run_as_nobody(_AS_NOBODY, str(base), home=str(base))
        for name, (_, why) in ATTACKS.items():
            assert why in verdicts[name], (name, verdicts[name])
        assert verdicts["cve-2025-4517"] != "unpacked"
        assert (outside / "target").read_text() == "untouched"
        assert sorted(p.name for p in outside.iterdir()) == ["target"]
    finally:
        shutil.rmtree(base, ignore_errors=True)
