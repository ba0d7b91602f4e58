"""The README's supervisor with a real process: `make up`'s object store (SeaweedFS), killed
with SIGKILL, is started again on its port and data by the local stack's supervisor
(tiergate.local.jobs), says so, and serves what was stored before (that a stopping stack
restarts nothing is tests/unit/test_supervisor.py's). Real SeaweedFS, a real S3 client."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import boto3
import botocore.exceptions
from botocore.config import Config

from tests.waiting import eventually
from tiergate.local.jobs import _supervise_server
from tiergate.local.servers import LOCAL_CREDENTIALS, ensure_bucket, object_store
from tiergate.local.supervisor import Backoff, Supervisor

FAST = Backoff(first_seconds=0.2, ceiling_seconds=1.0, reset_after_seconds=30.0)


def _client(url: str, attempts: int | None = None) -> object:
    """An S3 client; ``attempts``: how many tries a call gets (boto3's default retries
    otherwise)."""
    config = None if attempts is None else Config(retries={"max_attempts": attempts})
    return boto3.client(
        "s3",
        config=config,
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )


def test_a_killed_object_store_comes_back_with_its_data(tmp_path: Path) -> None:
    store = object_store(tmp_path / "s3", tmp_path / "seaweedfs.log")
    store.start()
    said: list[str] = []
    supervisor = Supervisor(said.append, backoff=FAST)
    try:
        bucket = f"kept-{uuid.uuid4().hex[:8]}"
        ensure_bucket(store.url, bucket)
        s3 = _client(store.url)
        s3.put_object(Bucket=bucket, Key="k", Body=b"before the kill")  # type: ignore[attr-defined]
        _supervise_server(supervisor, store)
        killed = store.proc
        assert killed is not None
        os.kill(killed.pid, signal.SIGKILL)

        def back() -> bool:
            if store.proc is killed:
                return False
            try:
                got = _client(store.url).get_object(Bucket=bucket, Key="k")  # type: ignore[attr-defined]
            except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError):
                return False
            return bool(got["Body"].read() == b"before the kill")

        eventually(back, 90, 0.5, lambda: f"the store back with its data; said {said}")
        assert any("signal 9" in line and "restarting" in line for line in said), said
    finally:
        supervisor.stop()
        store.stop()


def test_a_restarted_object_store_serves_its_objects_as_soon_as_it_is_ready(
    tmp_path: Path,
) -> None:
    """`make up` run a second time stopped once with "object storage refused a read
    (InternalError)": SeaweedFS's S3 API answered before its volume server had told the
    master which volumes it holds ("volume 1 not found"). Ready now means readable: the
    first read after each start, with no retry, gets the object back."""
    store = object_store(tmp_path / "s3", tmp_path / "seaweedfs.log")
    store.start()
    try:
        # Three buckets, a volume each, as the local stack has (jobs, broker, and one more).
        buckets = [f"kept-{i}-{uuid.uuid4().hex[:8]}" for i in range(3)]
        for bucket in buckets:
            ensure_bucket(store.url, bucket)
            _client(store.url).put_object(Bucket=bucket, Key="k", Body=b"kept")  # type: ignore[attr-defined]
        for _ in range(4):
            store.restart()
            once = _client(store.url, attempts=1)
            for bucket in buckets:
                got = once.get_object(Bucket=bucket, Key="k")  # type: ignore[attr-defined]
                assert got["Body"].read() == b"kept"
    finally:
        store.stop()
