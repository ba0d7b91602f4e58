"""The sandbox's harder walls, with real bubblewrap: no nested user namespaces, a
system-call filter, and a verifier that reads a copy of the workspace the agent could not
plant its reward or Python modules in."""

from __future__ import annotations

import io
import os
import platform
import shutil
import subprocess
import tarfile
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.jobstack import JobsStack, jobs_stack
from tiergate.jobsettings import SandboxSettings
from tiergate.protocol import JobLimits
from tiergate.sandbox import Sandbox, probe_limits, seccomp
from tiergate.sandbox.bwrap import command_argv
from tiergate.sandbox.errors import SeccompUnavailable

WORK = "/tmp/tiergate-sandboxes/walls"
ROOT = os.geteuid() == 0
X86_64 = platform.machine() == "x86_64"

# Calls the filter refuses and an unprivileged process may otherwise make, and the socket
# families it keeps: keyctl, ptrace, personality, pidfd_getfd, process_madvise and
# fanotify_init work without the filter, so their EPERM is the filter's. The sockets the
# filter refuses fail without it for other reasons wherever the family is missing or wants
# a capability; the sweep over families asks for type 99, which the kernel refuses with
# EINVAL before it looks at the family, and the filter with EPERM.
PROBE = r"""
import ctypes, mmap, os
libc = ctypes.CDLL(None, use_errno=True)
def call(name, result):
    print(name, "ok" if result != -1 else os.strerror(ctypes.get_errno()))
call("keyctl", libc.syscall(250, 0, -3, 0))  # KEYCTL_GET_KEYRING_ID, the session keyring
call("ptrace", libc.ptrace(0, 0, 0, 0))  # PTRACE_TRACEME
call("personality", libc.personality(0x0040000))  # ADDR_NO_RANDOMIZE
call("clone3", libc.syscall(435, 0, 0))
call("unshare", libc.unshare(0x10000000))  # CLONE_NEWUSER
call("mount", libc.mount(b"none", b"/tmp", b"tmpfs", 0, None))
pidfd = libc.syscall(434, os.getpid(), 0)  # pidfd_open (allowed) on itself
call("pidfd_getfd", libc.syscall(438, pidfd, 1, 0))  # a copy of its own stdout
page = mmap.mmap(-1, 4096)
iov = (ctypes.c_void_p * 2)(ctypes.addressof(ctypes.c_char.from_buffer(page)), 4096)
call("process_madvise", libc.syscall(440, pidfd, iov, 1, 20, 0))  # MADV_COLD, its own page
call("fanotify_init", libc.fanotify_init(0x200, 0))  # FAN_REPORT_FID, allowed unprivileged
call("vsock", libc.socket(40, 1, 0))  # AF_VSOCK, SOCK_STREAM
call("vsock_high", libc.syscall(41, ctypes.c_long(1 << 32 | 40), 1, 0))  # the kernel reads 40
call("vsock_pair", libc.socketpair(40, 1, 0, (ctypes.c_int * 2)()))
call("smc", libc.socket(2, 1, 256))  # IPPROTO_SMC over AF_INET
for family, kind in ((1, 1), (2, 1), (10, 1), (16, 3)):  # NETLINK_ROUTE is SOCK_RAW
    call(f"af{family}", libc.socket(family, kind, 0))
call("unix_pair", libc.socketpair(1, 1, 0, (ctypes.c_int * 2)()))
for family in range(47):
    if family not in (1, 2, 10, 16):
        call(f"af{family}", libc.socket(family, 99, 0))
"""
ALLOWED_FAMILIES = (1, 2, 10, 16)  # AF_UNIX, AF_INET, AF_INET6, AF_NETLINK
REFUSED_FAMILIES = [f for f in range(47) if f not in ALLOWED_FAMILIES]
NEW_CALLS = ("pidfd_getfd", "process_madvise", "fanotify_init")
EPERM = "Operation not permitted"

ORDINARY = (
    "echo a | tr a b > piped.txt && sh -c 'cat piped.txt' && "
    'python3 -c "import subprocess, threading; '
    "print(subprocess.run(['echo', 'child'], capture_output=True, text=True).stdout.strip()); "
    "t = threading.Thread(target=print, args=('thread',)); t.start(); t.join()\""
)


def _box(settings: SandboxSettings | None = None) -> Sandbox:
    return Sandbox(
        f"w{uuid.uuid4().hex[:8]}",
        JobLimits(memory_mb=256, disk_mb=5),
        settings or SandboxSettings(work_dir=WORK),
    )


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    box = _box()
    yield box
    box.close()


def _lines(output: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in output.splitlines() if " " in line)


def test_nested_namespaces_are_refused_inside_the_sandbox(sandbox: Sandbox) -> None:
    result = sandbox.run(
        "unshare -U true; echo unshare=$?; unshare --user --map-root-user true; echo map=$?; "
        "bwrap --ro-bind / / true; echo bwrap=$?; echo fine > ok.txt && cat ok.txt",
        timeout=20,
    )
    lines = result.output.splitlines()
    assert "unshare=1" in lines and "map=1" in lines and "bwrap=1" in lines, result.output
    assert result.exit_code == 0 and lines[-1] == "fine", result.output


def test_disable_userns_holds_without_the_filter() -> None:
    """--disable-userns on its own (no --seccomp): the kernel refuses a nested user
    namespace with ENOSPC (its limit, set to 1 in the sandbox), not the filter's EPERM."""
    top = Path(tempfile.mkdtemp(prefix="tiergate-walls-", dir="/tmp"))
    top.chmod(0o755)  # the sandbox user reaches its workspace
    workspace = top / "ws"
    workspace.mkdir()
    if ROOT:
        os.chown(workspace, SandboxSettings().uid, SandboxSettings().gid)
    argv = command_argv(
        workspace,
        "unshare -U true; echo unshare=$?; echo fine",
        JobLimits(),
        SandboxSettings(),
        cpu_seconds=10,
        as_root=ROOT,
        gated=False,
    )
    assert "--disable-userns" in argv and "--seccomp" not in argv
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    finally:
        shutil.rmtree(top, ignore_errors=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["unshare=1", "fine"], out
    assert "No space left on device" in out.stderr, out.stderr


@pytest.mark.skipif(not X86_64, reason="the probe uses x86_64 system-call numbers")
def test_the_filter_refuses_what_a_job_has_no_use_for(sandbox: Sandbox) -> None:
    result = sandbox.run(f"python3 -c '{PROBE}' && {ORDINARY}", timeout=30)
    assert result.exit_code == 0, result.output
    calls = _lines(result.output)
    for name in ("keyctl", "ptrace", "personality", "unshare", "mount", *NEW_CALLS):
        assert calls[name] == EPERM, result.output
    for name in ("vsock", "vsock_high", "vsock_pair", "smc"):
        assert calls[name] == EPERM, result.output
    assert {f: calls[f"af{f}"] for f in REFUSED_FAMILIES} == dict.fromkeys(
        REFUSED_FAMILIES, EPERM
    ), result.output
    for name in (*(f"af{f}" for f in ALLOWED_FAMILIES), "unix_pair"):
        assert calls[name] == "ok", result.output
    assert calls["clone3"] == "Function not implemented", result.output  # libc falls back
    assert result.output.split()[-3:] == ["b", "child", "thread"], result.output


@pytest.mark.skipif(not X86_64, reason="the probe uses x86_64 system-call numbers")
def test_without_the_filter_the_same_calls_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: the EPERMs above are the filter's (allowed off, the calls succeed or
    fail with another error: a host without vsock or SMC, or type 99 in the sweep)."""
    monkeypatch.setattr(seccomp, "compiled", _unavailable)
    box = _box(SandboxSettings(work_dir=WORK, allow_no_seccomp=True))
    try:
        result = box.run(f"python3 -c '{PROBE}'", timeout=30)
    finally:
        box.close()
    calls = _lines(result.output)
    assert result.exit_code == 0, result.output
    names = ("keyctl", "ptrace", "personality", "pidfd_getfd", "process_madvise")
    assert [calls[n] for n in names] == ["ok"] * 5, result.output
    for name in ("fanotify_init", "vsock", "vsock_high", "vsock_pair", "smc"):
        assert calls[name] != EPERM, result.output
    assert calls["vsock_high"] == calls["vsock"], result.output  # the same call to the kernel
    for family in REFUSED_FAMILIES:
        assert calls[f"af{family}"] == "Invalid argument", result.output
    for name in (*(f"af{f}" for f in ALLOWED_FAMILIES), "unix_pair"):
        assert calls[name] == "ok", result.output


def _unavailable() -> bytes:
    raise seccomp.unavailable("no libseccomp here (test)")


def test_no_filter_means_no_worker_unless_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(seccomp, "compiled", _unavailable)
    settings = SandboxSettings(work_dir=WORK, allow_unlimited=True)
    with pytest.raises(SeccompUnavailable, match="allow_no_seccomp=true"):
        probe_limits(settings)
    with pytest.raises(SeccompUnavailable):
        _box(settings)
    allowed = settings.model_copy(update={"allow_no_seccomp": True})
    assert "seccomp OFF" in probe_limits(allowed)


def test_the_filter_builds_here() -> None:
    assert "seccomp filter" in seccomp.probe_seccomp(SandboxSettings())
    assert len(seccomp.compiled()) % 8 == 0  # struct sock_filter: 8 bytes each


# -- the verifier's copy ------------------------------------------------------------------

PLANT = (
    "```bash\n"
    "echo 1.0 > reward.txt\n"
    "for m in sitecustomize os json; do "
    'printf \'open("/workspace/reward.txt", "w").write("1.0")\\n\' > $m.py; done\n'
    "mkdir -p .local/lib/python3.11/site-packages && "
    "cp sitecustomize.py .local/lib/python3.11/site-packages/usercustomize.py\n"
    "echo 41 > answer.txt\n"
    "```"
)
CHECK = "python3 -c 'import json, os; print(\"checked\")'"
TASK: dict[str, Any] = {
    "model": MODEL,
    "instruction": "Write six times seven into answer.txt.",
    "limits": {"max_steps": 3, "timeout_seconds": 60},
}


def _final(stack: JobsStack, body: dict[str, Any]) -> dict[str, Any]:
    job = stack.submit(body)
    stack.start_worker()
    return stack.wait(job["id"], lambda j: j["status"] not in ("queued", "in_progress"))


def test_a_planted_reward_or_module_gives_no_reward(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    model.behaviour.replies = [PLANT, "DONE"]
    verifier = {"command": f"{CHECK} && cd /workspace && {CHECK}", "reward_file": "reward.txt"}
    with jobs_stack(broker, s3, model, tmp_path) as stack:
        final = _final(stack, {**TASK, "verifier": verifier})
        assert final["status"] == "completed", final
        assert final["result"] == {
            "passed": True,
            "reward": None,
            "rewards": None,
            "verifier_exit_code": 0,
        }
        assert httpx.get(final["artifacts"]["verifier_log"]).text.split() == ["checked"] * 2
        # The artifact is the agent's workspace, planted files and all.
        archive = httpx.get(final["artifacts"]["workspace"]).content
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            planted = tar.extractfile("workspace/reward.txt")
            assert planted is not None and planted.read() == b"1.0\n"
            assert "workspace/sitecustomize.py" in tar.getnames()


@pytest.mark.parametrize(
    ("written", "reward", "rewards"),
    [
        (".75", 0.75, None),
        # Several rewards by name: kept, and summed into the reward.
        ('{"correct": 0.5, "format": 0.25}', 0.75, {"correct": 0.5, "format": 0.25}),
    ],
)
def test_a_reward_the_verifier_writes_counts(
    broker: str,
    s3: str,
    model: FakeVllm,
    tmp_path: Path,
    written: str,
    reward: float,
    rewards: dict[str, float] | None,
) -> None:
    model.behaviour.replies = ["```bash\necho 0.25 > reward.txt; echo 42 > answer.txt\n```", "DONE"]
    verifier = {
        "command": 'test "$(cat answer.txt)" = 42 && test ! -e reward.txt'
        f" && echo '{written}' >reward.txt",
        "reward_file": "reward.txt",
    }
    with jobs_stack(broker, s3, model, tmp_path) as stack:
        final = _final(stack, {**TASK, "verifier": verifier})
        assert final["status"] == "completed", final
        assert final["result"] == {
            "passed": True,
            "reward": reward,
            "rewards": rewards,
            "verifier_exit_code": 0,
        }
