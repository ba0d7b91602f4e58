"""A job cannot make its worker hold what it wrote: the workspace artifact streams from a
file to the object store in parts, the reward file is read bounded, and an uploaded
archive is checked and unpacked by a child process, under rlimits, as the job's user.
Real components: the sandbox (bubblewrap, cgroup), SeaweedFS for the store."""

from __future__ import annotations

import hashlib
import logging
import os
import tarfile
import tracemalloc
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import boto3
import pytest

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.jobs.archives import tar_of
from tests.jobstack import jobs_stack
from tiergate.jobs.run.jobsandbox import REWARD_MAX_BYTES, read_reward, store_artifacts
from tiergate.jobs.state.store import JobStore
from tiergate.jobsettings import SandboxSettings, StorageSettings
from tiergate.protocol import JobLimits
from tiergate.sandbox import Sandbox, SandboxError

MiB = 1024 * 1024
ROOT = os.geteuid() == 0
_T = TypeVar("_T")
TERMINAL = ("completed", "failed", "cancelled", "incomplete")


def _settings(**extra: int) -> SandboxSettings:
    return SandboxSettings(work_dir="/tmp/tiergate-sandboxes/memory", **extra)


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    box = Sandbox(f"m{uuid.uuid4().hex[:8]}", JobLimits(memory_mb=96, disk_mb=512), _settings())
    yield box
    box.close()


def _peak(fn: Callable[[], _T]) -> tuple[_T, int]:
    """What ``fn`` returns, and the most Python memory allocated at once while it ran (every
    thread's: the store's transfer threads included)."""
    tracemalloc.start()
    try:
        return fn(), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_large_workspace_streams_to_the_store_in_parts(sandbox: Sandbox, s3: str) -> None:
    size = 96 * MiB  # incompressible: the .tar.gz is as large, so it goes up in 12 parts or more
    digest = hashlib.sha256()
    with (sandbox.workspace / "big.bin").open("wb") as out:
        for _ in range(size // MiB):
            block = os.urandom(MiB)
            digest.update(block)
            out.write(block)
    store = JobStore(StorageSettings(endpoint_url=s3, bucket=f"memory-{uuid.uuid4().hex[:8]}"))
    store.ensure_bucket()
    job_id = f"job_{uuid.uuid4().hex}"

    _, peak = _peak(lambda: store_artifacts(store, job_id, sandbox, [{"type": "x"}], "log"))
    print(f"peak {peak} bytes for a {size} byte workspace")

    assert peak < 24 * MiB, f"the worker held {peak // MiB} MiB for a {size // MiB} MiB artifact"
    assert not (sandbox.root / "artifact.tar.gz").exists()
    assert store.read_artifact(job_id, "verifier_log") == b"log"
    s3_client = boto3.client("s3", endpoint_url=s3, region_name="us-east-1")
    key = f"jobs/{job_id}/artifacts/workspace.tar.gz"
    etag = s3_client.head_object(Bucket=store.objects.bucket, Key=key)["ETag"].strip('"')
    assert int(etag.rpartition("-")[2] or 0) >= 12, f"not a multipart upload: {etag}"
    # The same object and format as ever: workspace/... in a gzip-compressed tar.
    body = s3_client.get_object(Bucket=store.objects.bucket, Key=key)["Body"]
    with tarfile.open(fileobj=body, mode="r|gz") as tar:
        names = []
        for member in tar:
            names.append(member.name)
            if member.name == "workspace/big.bin":
                data = tar.extractfile(member)
                assert data is not None
                got = hashlib.sha256()
                while chunk := data.read(MiB):
                    got.update(chunk)
                assert got.hexdigest() == digest.hexdigest()
    assert names == ["workspace", "workspace/big.bin"]


def test_the_reward_file_is_read_bounded(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "reward.txt").write_text("0.75\n")
    assert read_reward(tmp_path, "reward.txt") == 0.75
    # Just over the bound, however good the number at its start: no reward, said in the log.
    (tmp_path / "long.txt").write_bytes(b"1.0\n" + b"x" * (REWARD_MAX_BYTES - 3))
    with caplog.at_level(logging.WARNING, logger="tiergate.worker"):
        assert read_reward(tmp_path, "long.txt") is None
    assert f"over {REWARD_MAX_BYTES} bytes" in caplog.text
    (tmp_path / "exact.txt").write_bytes(b"1.0\n" + b" " * (REWARD_MAX_BYTES - 4))
    assert read_reward(tmp_path, "exact.txt") == 1.0
    # A huge one (sparse: nothing on disk) is refused without being read whole.
    with (tmp_path / "huge.txt").open("wb") as out:
        out.write(b"1\n")
        out.truncate(256 * MiB)
    reward, peak = _peak(lambda: read_reward(tmp_path, "huge.txt"))
    assert reward is None
    assert peak < 1 * MiB, f"reading the reward held {peak} bytes"


def test_an_archive_over_the_member_cap_is_refused_at_extraction() -> None:
    box = Sandbox(
        f"m{uuid.uuid4().hex[:8]}", JobLimits(disk_mb=8), _settings(max_upload_members=100)
    )
    try:
        with pytest.raises(SandboxError, match=r"more than 100 members .*max_upload_members"):
            box.extract(tar_of({f"f{i}": b"" for i in range(101)}, "w:gz"))
        assert not any(box.workspace.iterdir()), "something was unpacked before the refusal"
        box.extract(tar_of({f"f{i}": b"" for i in range(100)}, "w:gz"))
        assert len(list(box.workspace.iterdir())) == 100
    finally:
        box.close()


def test_the_default_member_cap_holds_and_costs_the_worker_nothing(sandbox: Sandbox) -> None:
    cap = _settings().max_upload_members
    archive = tar_of({f"d/{i}": b"" for i in range(cap + 1)}, "w:gz")
    # The member records are the child's: the worker holds the archive's bytes, no more.
    with pytest.raises(SandboxError, match=f"more than {cap} members") as refused:
        tracemalloc.start()
        try:
            sandbox.extract(archive)
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
    assert "sandbox.max_upload_members" in str(refused.value)
    assert peak < 2 * MiB, f"the worker held {peak} bytes of member records"
    assert not any(sandbox.workspace.iterdir())


def test_extraction_writes_as_the_sandbox_user(sandbox: Sandbox) -> None:
    sandbox.extract(tar_of({"src/main.py": b"print(1)\n", "top.txt": b"x"}, "w:gz"))
    want = (_settings().uid, _settings().gid) if ROOT else (os.getuid(), os.getgid())
    for rel in ("src", "src/main.py", "top.txt"):
        info = (sandbox.workspace / rel).stat()
        assert (info.st_uid, info.st_gid) == want, rel
    assert (sandbox.workspace / "src/main.py").read_text() == "print(1)\n"


@pytest.mark.skipif(not ROOT, reason="a worker that is not root has no privileges to drop")
def test_extraction_cannot_write_where_the_job_cannot(sandbox: Sandbox) -> None:
    # A directory of the worker's (root's) in the workspace: the worker itself could write
    # there; the job's user, who unpacks, cannot.
    (sandbox.workspace / "locked").mkdir(mode=0o755)
    with pytest.raises(SandboxError, match="Permission denied"):
        sandbox.extract(tar_of({"locked/f.txt": b"x"}))
    assert not (sandbox.workspace / "locked/f.txt").exists()


def test_the_name_checks_hold_in_the_child(sandbox: Sandbox) -> None:
    for files, why in (
        ({"../escape.txt": b"x"}, "outside the workspace"),
        ({"a": b"x", "a/b": b"y"}, "below a link or a file"),
    ):
        with pytest.raises(SandboxError, match=why) as refused:
            sandbox.extract(tar_of(files))
        assert str(sandbox.root) not in str(refused.value), "a worker path in the message"
    assert not (sandbox.root / "escape.txt").exists()


def test_a_job_whose_upload_is_over_the_member_cap_fails_and_the_next_runs(
    broker: str, s3: str, model: FakeVllm, tmp_path: Path
) -> None:
    """Through a worker: an upload the store holds (put there directly, as one stored
    before the gateway's cap, or under a higher one) is checked again at extraction."""
    model.behaviour.replies = ["```bash\nls src > listing.txt\n```", "DONE"]
    jobs = {"sandbox": {"max_upload_members": 50}, "kafka": {"partitions": 1}}
    with jobs_stack(broker, s3, model, tmp_path, jobs=jobs) as stack:
        store = JobStore(stack.jobs.storage)
        over, fine = f"upl_{uuid.uuid4().hex}", f"upl_{uuid.uuid4().hex}"
        store.put_upload("anonymous", over, tar_of({f"f{i}": b"" for i in range(51)}, "w:gz"))
        store.put_upload("anonymous", fine, tar_of({"src/a.py": b"1", "src/b.py": b"2"}))
        body = {
            "model": MODEL,
            "instruction": "List src.",
            "verifier": {"command": "grep -q b.py listing.txt"},
            "limits": {"max_steps": 3, "timeout_seconds": 60},
        }
        refused = stack.submit({**body, "workspace": {"upload_id": over}})["id"]
        ran = stack.submit({**body, "workspace": {"upload_id": fine}})["id"]
        stack.start_worker()
        done = {
            i: stack.wait(i, lambda j: j["status"] in TERMINAL, timeout=120) for i in (refused, ran)
        }
    assert done[refused]["status"] == "failed", done[refused]
    assert done[refused]["error"]["code"] == "sandbox", done[refused]
    assert "more than 50 members" in done[refused]["error"]["message"], done[refused]
    assert done[ran]["status"] == "completed", done[ran]
    assert done[ran]["result"]["passed"] is True, done[ran]
