from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakes.fake_vllm import FakeVllm


@pytest.fixture
def fakes() -> Iterator[list[FakeVllm]]:
    """Three fresh fake vLLM servers (two for the standard tier, one for fast)."""
    servers = [FakeVllm().start() for _ in range(3)]
    yield servers
    for server in servers:
        server.stop()
