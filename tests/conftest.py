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


# -- how long each folder took (tests/README.md quotes these lines) ------------------------

_FOLDER_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Adds each test's setup, call and teardown time (a session server's start counts
    where it happens) to its folder's total."""
    parts = report.nodeid.split("/")
    folder = "/".join(parts[:2]) if len(parts) > 2 else parts[0]
    _FOLDER_SECONDS[folder] = _FOLDER_SECONDS.get(folder, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _FOLDER_SECONDS:
        return
    terminalreporter.section("seconds per folder")
    for folder, seconds in sorted(_FOLDER_SECONDS.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{folder:<16} {seconds:8.1f}")
