"""The real sandbox (bubblewrap): isolation and limits, as a job's commands see them."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.jobs.archives import tar_of
from tests.jobs.unprivileged import NOBODY, V2, controller_dirs, delegated, run_as_nobody
from tiergate.jobsettings import JobsSettings, SandboxSettings
from tiergate.protocol import JobLimits
from tiergate.sandbox import LimitsUnavailable, Sandbox, SandboxError, probe_limits

REPO = Path(__file__).resolve().parents[2]
ROOT = os.geteuid() == 0


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    box = Sandbox(
        f"t{uuid.uuid4().hex[:8]}",
        JobLimits(memory_mb=96, disk_mb=5),
        SandboxSettings(work_dir="/tmp/tiergate-sandboxes/unit"),
    )
    yield box
    box.close()


def test_commands_run_in_the_workspace_as_an_unprivileged_user(sandbox: Sandbox) -> None:
    sandbox.write_files({"pkg/hello.py": "print('hello')"})
    result = sandbox.run("pwd && python3 pkg/hello.py && id -u && touch made.txt", timeout=10)
    assert result.exit_code == 0, result.output
    lines = result.output.split()
    assert lines[:2] == ["/workspace", "hello"]
    if os.geteuid() == 0:
        uid = SandboxSettings().uid
        assert lines[2] == str(uid)
        assert (sandbox.workspace / "made.txt").stat().st_uid == uid


def test_no_network_even_to_loopback(sandbox: Sandbox) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        result = sandbox.run(
            f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2)\"",
            timeout=10,
        )
    finally:
        server.close()
    assert result.exit_code != 0
    assert "refused" in result.output.lower() or "unreachable" in result.output.lower()


def test_host_files_are_out_of_reach(sandbox: Sandbox) -> None:
    """Paths that exist on this host (checked here first) do not exist in the sandbox,
    each on its own; the read-only system cannot be written."""
    host = ["/root", "/etc/shadow", "/etc/passwd", str(REPO / "pyproject.toml"), "/proc/1/root/etc"]
    present = [path for path in host if os.path.exists(path)]
    assert len(present) >= 4, present
    probe = " ".join(f"test -e {path} && echo present:{path};" for path in present)
    result = sandbox.run(
        f"{probe} echo x > /usr/x 2>/dev/null && echo wrote; echo checked", timeout=10
    )
    assert result.output.strip().splitlines()[-1] == "checked", result.output
    assert "present:" not in result.output and "wrote" not in result.output, result.output
    assert not os.path.exists("/usr/x")


def test_memory_limit_kills_the_command(sandbox: Sandbox) -> None:
    """96 MiB: 40 MiB is allowed, 400 MiB is killed by the kernel (SIGKILL, 137), not
    refused by anything else."""
    allowed = sandbox.run("python3 -c 'b = bytearray(40 * 1024 * 1024)'", timeout=20)
    assert allowed.exit_code == 0, allowed.output
    result = sandbox.run("python3 -c 'b = bytearray(400 * 1024 * 1024)'", timeout=20)
    assert result.exit_code == 137, (result.exit_code, result.output)


def test_timeout_kills_the_whole_tree(sandbox: Sandbox) -> None:
    result = sandbox.run("(sleep 30 &) ; sleep 30", timeout=1)
    assert result.timed_out and result.exit_code == 124


def test_file_size_limit(sandbox: Sandbox) -> None:
    result = sandbox.run("head -c 20000000 /dev/zero > big.bin", timeout=10)
    assert result.exit_code != 0
    assert (sandbox.workspace / "big.bin").stat().st_size <= 5 * 1024 * 1024


def test_output_is_truncated_head_and_tail(sandbox: Sandbox) -> None:
    result = sandbox.run("seq 1 100000", timeout=10)
    assert len(result.output) < 2200
    assert result.output.startswith("1\n2\n") and result.output.rstrip().endswith("100000")


def test_workspace_escape_is_refused(sandbox: Sandbox) -> None:
    with pytest.raises(SandboxError):
        sandbox.write_files({"../../etc/evil": "x"})


def test_fork_bomb_is_contained(sandbox: Sandbox) -> None:
    """The bomb is refused forks (the job's process budget, sandbox.max_processes: 256),
    is seen holding many processes and never more than the budget; once it is gone the
    sandbox starts processes again."""
    limit = SandboxSettings().max_processes
    peak = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], sandbox.process_count())
            done.wait(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        # (Not `:(){ :|:& };:`: /bin/sh is dash here, which takes no function named `:`.)
        # The command's shell waits for a sleeper forked before the bomb: when it exits, its
        # PID namespace is killed, bomb and all, and a shell that returned at once (as the
        # bare bomb's does) left the bomb a few milliseconds, on a loaded CI machine not
        # enough to fork anything ('Cannot fork' missing, output empty, 6 ms).
        result = sandbox.run("sleep 3 & s=$!; bomb() { bomb | bomb & }; bomb; wait $s", timeout=10)
    finally:
        done.set()
        watcher.join(10)
    assert "Cannot fork" in result.output, result.output
    assert limit // 2 <= peak[0] <= limit, (peak[0], limit)
    assert sandbox.run("echo alive", timeout=10).output.strip() == "alive"


def test_no_process_outlives_its_command(sandbox: Sandbox) -> None:

    marker = f"tiergate-outlive-{uuid.uuid4().hex[:8]}"
    result = sandbox.run(
        f"(exec -a {marker} sleep 300) > /dev/null 2>&1 & echo started", timeout=10
    )
    assert result.output.strip() == "started"
    # The command has returned: nothing it started may be left, at once (no waiting).
    survivors = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    assert survivors.stdout.strip() == "", "a sandboxed process outlived its command"


def test_timeout_is_said_in_the_output(sandbox: Sandbox) -> None:
    result = sandbox.run("echo started; sleep 30", timeout=1)
    assert result.exit_code == 124
    assert result.output.startswith("started") and "[timed out after 1s]" in result.output


def test_huge_output_is_read_bounded(sandbox: Sandbox) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    result = sandbox.run(
        "echo first; head -c 300000000 /dev/zero | tr '\\0' x; echo; echo last", timeout=120
    )
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert result.exit_code == 0, result.output[-500:]
    assert result.output.startswith("first\nxxx") and result.output.endswith("x\nlast\n")
    assert "characters cut ...]" in result.output and len(result.output) < 2200
    cut = int(result.output.split("[... ")[1].split(" ")[0])
    assert cut == len("first\n") + 300_000_000 + len("\nlast\n") - 2000
    assert grown_kib < 50 * 1024, f"the worker grew by {grown_kib} KiB"


def test_write_files_conflicts_are_sandbox_errors(sandbox: Sandbox) -> None:
    with pytest.raises(SandboxError):
        sandbox.write_files({"a": "x", "a/b": "y"})
    with pytest.raises(SandboxError):
        sandbox.write_files({"c/d": "y", "c": "x"})
    with pytest.raises(SandboxError):
        sandbox.write_files({"nul\0name": "x"})


def test_extract_unpacks_a_tar(sandbox: Sandbox) -> None:
    sandbox.extract(tar_of({"src/main.py": b"print(1)\n"}, "w:gz"))
    assert (sandbox.workspace / "src/main.py").read_text() == "print(1)\n"


def test_extract_refuses_what_is_not_a_tar(sandbox: Sandbox) -> None:
    with pytest.raises(SandboxError):
        sandbox.extract(b"this is not an archive at all" * 100)
    with pytest.raises(SandboxError):
        sandbox.extract(tar_of({"a.txt": b"x" * 10_000}, "w:gz")[:-200])  # cut short


def test_extract_refuses_more_than_the_disk_limit(sandbox: Sandbox) -> None:
    with pytest.raises(SandboxError, match="disk limit"):
        sandbox.extract(tar_of({"big.bin": bytes(6 * 1024 * 1024)}, "w:gz"))  # disk_mb=5
    with pytest.raises(SandboxError, match="disk limit"):
        sandbox.extract(tar_of({"a.bin": bytes(600), "b.bin": bytes(600)}, "w:gz"), max_bytes=1000)
    assert not any(sandbox.workspace.iterdir())


def test_check_disk(sandbox: Sandbox) -> None:
    sandbox.write_files({"f.txt": "x" * 2000})
    assert sandbox.check_disk() == 2000
    with pytest.raises(SandboxError, match="disk limit"):
        sandbox.check_disk(limit_bytes=1000)


@pytest.mark.skipif(not ROOT, reason="needs root (CI runs as root)")
def test_probe_limits_finds_the_hosts_cgroup_as_root() -> None:
    """Root finds (and makes) the parent on whichever cgroup version the host mounts."""
    found = probe_limits(SandboxSettings())
    if V2:
        assert found.startswith("cgroup v2 at /sys/fs/cgroup/tiergate"), found
    else:
        assert found.startswith("cgroup v1 at /sys/fs/cgroup/{memory,pids,cpu}/tiergate"), found


def test_probe_limits_without_a_cgroup(tmp_path: Path) -> None:
    missing = SandboxSettings(cgroup_root=str(tmp_path / "absent"))
    with pytest.raises(LimitsUnavailable, match="allow_unlimited=true"):
        probe_limits(missing)
    # A v1-looking tree whose parent cannot be made (a file is in the way).
    for controller in ("memory", "pids", "cpu"):
        (tmp_path / controller).mkdir()
        (tmp_path / controller / "tasks").write_text("")
    (tmp_path / "memory" / "tiergate").write_text("in the way")
    blocked = SandboxSettings(cgroup_root=str(tmp_path))
    with pytest.raises(LimitsUnavailable, match=str(tmp_path / "memory" / "tiergate")):
        probe_limits(blocked)
    opted_out = blocked.model_copy(update={"allow_unlimited": True})
    assert "limits OFF" in probe_limits(opted_out)


def test_sandbox_needs_limits_unless_allowed(tmp_path: Path) -> None:
    settings = SandboxSettings(
        work_dir="/tmp/tiergate-sandboxes/unit", cgroup_root=str(tmp_path / "absent")
    )
    with pytest.raises(LimitsUnavailable):
        Sandbox(f"t{uuid.uuid4().hex[:8]}", JobLimits(), settings)
    box = Sandbox(
        f"t{uuid.uuid4().hex[:8]}",
        JobLimits(),
        settings.model_copy(update={"allow_unlimited": True}),
    )
    try:
        assert box.run("echo unlimited", timeout=10).output.strip() == "unlimited"
    finally:
        box.close()


_DELEGATED_WORKER = """
import json, os, sys
from tiergate.protocol import JobLimits
from tiergate.sandbox import Sandbox, probe_limits
from tiergate.jobsettings import JobsSettings, SandboxSettings

settings = SandboxSettings.model_validate_json(sys.argv[2])
found = probe_limits(settings)
box = Sandbox("delegated", JobLimits(memory_mb=96), settings)
try:
    made = os.path.isdir(sys.argv[3])
    echo = box.run("id -u", timeout=20)
    hog = box.run("python3 -c 'b = bytearray(400 * 1024 * 1024)'", timeout=20)
    bomb = box.run("bomb() { bomb | bomb & }; bomb", timeout=5)
    after = box.run("echo alive", timeout=10)
finally:
    box.close()
print(json.dumps([os.geteuid(), found, made, echo.output, hog.exit_code, after.output]))
"""


@pytest.mark.skipif(not ROOT, reason="needs root to delegate (CI runs as root)")
def test_unprivileged_worker_with_a_delegated_parent() -> None:
    """A worker as uid 65534 with a cgroup parent delegated to it (on the host's cgroup
    version, tests/jobs/unprivileged.py): it finds the parent, makes its job's cgroup there,
    the memory limit holds, a fork bomb stops only itself, and nothing is left behind."""
    with delegated(JobsSettings()) as jobs:
        sandbox = jobs.sandbox
        dirs = controller_dirs(sandbox.cgroup_parent)
        uid, found, made, echo, hog_exit, after = run_as_nobody(
            _DELEGATED_WORKER,
            sandbox.model_dump_json(),
            str(dirs[0] / "job-delegated"),
            home=sandbox.work_dir,
            cgroup_parent=sandbox.cgroup_parent,
            timeout=120,
        )
        assert uid == NOBODY and made
        assert found.startswith(f"cgroup v{2 if V2 else 1} at"), found
        assert echo.strip() == str(NOBODY)
        assert hog_exit != 0  # the delegated cgroup's memory limit held
        assert after.strip() == "alive"
        assert not any(any(path.glob("job-*")) for path in dirs)  # removed by the worker


def test_a_ready_cgroup_v2_parent_is_found(tmp_path: Path) -> None:
    from tiergate.sandbox.cgroup import find_parent

    # Only the files find_parent reads (a real v2 tree has them from the kernel).
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("cpu memory pids\n")
    (tmp_path / "cgroup.procs").write_text("")
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "cgroup.subtree_control").write_text("cpu memory pids\n")
    parent = find_parent(SandboxSettings(cgroup_root=str(tmp_path), cgroup_parent="jobs"))
    assert parent.version == 2 and parent.describe() == f"cgroup v2 at {tmp_path}/jobs"
