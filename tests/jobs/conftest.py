"""Fake model backends for the job tests (the broker and S3 come from tests/conftest.py)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from tests.fakes.fake_vllm import FakeVllm
from tests.jobs.envs import built_test_env
from tiergate.envs.build import Built


@pytest.fixture
def model() -> Iterator[FakeVllm]:
    """FakeVllm as both tiers' model: scripted replies via ``model.behaviour.replies``."""
    fake = FakeVllm().start()
    yield fake
    fake.stop()


@pytest.fixture(scope="session")
def built_env() -> Built:
    """The test environment (tests/jobs/envs.py), built once or taken from the cache."""
    # A missing component is a failure, never a skip: scripts/bootstrap.sh installs
    # mmdebstrap, and CI runs as root.
    if shutil.which("mmdebstrap") is None or os.geteuid() != 0:
        pytest.fail("building an environment needs mmdebstrap (scripts/bootstrap.sh) and root")
    return built_test_env()
