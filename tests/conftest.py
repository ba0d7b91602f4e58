"""Servers shared by the job tests and the end-to-end tests: a real S3 API server
(SeaweedFS, on disk) and a real Kafka-protocol broker (Tansu) that keeps its log in it, the
same durable pair ``tiergate up`` runs. Started once per test session; the ``pipeline``
fixture lets a test restart either one."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tiergate.local.servers import LOCAL_CREDENTIALS, ObjectStore, Server, durable_pipeline


@pytest.fixture(scope="session")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ObjectStore, Server]]:
    for key, value in LOCAL_CREDENTIALS.items():
        os.environ.setdefault(key, value)
    root = Path(tmp_path_factory.mktemp("pipeline"))
    with durable_pipeline(root / "data", root / "logs") as servers:
        yield servers


@pytest.fixture(scope="session")
def broker(pipeline: tuple[ObjectStore, Server]) -> str:
    return pipeline[1].address


@pytest.fixture(scope="session")
def s3(pipeline: tuple[ObjectStore, Server]) -> str:
    return pipeline[0].url
