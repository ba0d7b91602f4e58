"""Fake model backends for the job tests (the broker and S3 come from tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakes.fake_vllm import FakeVllm


@pytest.fixture
def model() -> Iterator[FakeVllm]:
    """FakeVllm as both tiers' model: scripted replies via ``model.behaviour.replies``."""
    fake = FakeVllm().start()
    yield fake
    fake.stop()
