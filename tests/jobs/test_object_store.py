"""The local object store (SeaweedFS, as `make up` and the tests run it) takes writes in as
many buckets as are asked of it: left to itself it allows one volume, so one bucket, per GiB
of free disk, and CI's 47th bucket was refused (an InternalError on PutObject)."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import boto3

from tiergate.local.servers import ObjectStore, Server


def test_more_buckets_than_gib_of_free_disk_each_take_a_write(
    pipeline: tuple[ObjectStore, Server],
) -> None:
    store = pipeline[0]
    data_dir = Path(next(a for a in store.argv if a.startswith("-dir=")).removeprefix("-dir="))
    count = shutil.disk_usage(data_dir).free // 2**30 + 5
    s3 = boto3.client("s3", endpoint_url=store.url, region_name="us-east-1")
    prefix = f"many-{uuid.uuid4().hex[:8]}"
    for n in range(count):
        bucket = f"{prefix}-{n}"
        s3.create_bucket(Bucket=bucket)
        s3.put_object(Bucket=bucket, Key="k", Body=b"x")
        assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"x"
