"""The real sandbox (bubblewrap): isolation and limits, as a job's commands see them."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator

import pytest

from tiergate.queue.sandbox import Sandbox, SandboxError
from tiergate.queue.schema import JobLimits
from tiergate.settings import SandboxSettings


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
        assert lines[2] == "65534"
        assert (sandbox.workspace / "made.txt").stat().st_uid == 65534


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
    result = sandbox.run(
        "ls /root /home /work 2>&1; cat /etc/shadow 2>&1; echo x > /usr/x", timeout=10
    )
    assert "No such file" in result.output and result.exit_code != 0
    assert not os.path.exists("/usr/x")


def test_memory_limit_kills_the_command(sandbox: Sandbox) -> None:
    result = sandbox.run("python3 -c 'b = bytearray(400 * 1024 * 1024)'", timeout=20)
    assert result.exit_code != 0


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
    started = __import__("time").monotonic()
    result = sandbox.run(":(){ :|:& };:", timeout=5)
    assert __import__("time").monotonic() - started < 15
    assert result.exit_code != 0 or result.timed_out
    # The host still starts processes, and the sandbox does too once the bomb is gone.
    assert sandbox.run("echo alive", timeout=10).output.strip() == "alive"


def test_no_process_outlives_its_command(sandbox: Sandbox) -> None:
    import subprocess

    marker = f"tiergate-outlive-{uuid.uuid4().hex[:8]}"
    result = sandbox.run(
        f"(exec -a {marker} sleep 300) > /dev/null 2>&1 & echo started", timeout=10
    )
    assert result.output.strip() == "started"
    __import__("time").sleep(0.5)
    survivors = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    assert survivors.stdout.strip() == "", "a sandboxed process outlived its command"
