"""Fallback to the standard tier when the fast server dies (runs last: it kills a server)."""

from __future__ import annotations

import openai
import pytest

from tests.e2e.conftest import MODEL, VllmServer
from tiergate.tiers import Tier


@pytest.mark.e2e
@pytest.mark.kills_server
def test_fast_server_killed_falls_back_to_standard(
    gateway: str, vllm_servers: dict[Tier, VllmServer]
) -> None:
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0, timeout=120)
    before = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        service_tier="priority",
    )
    assert before.headers["x-tiergate-tier"] == "fast"
    vllm_servers[Tier.FAST].kill()
    for stream in (False, True):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=4,
            service_tier="priority",
            stream=stream,
        )
        assert raw.headers["x-tiergate-tier"] == "standard"
        assert raw.headers["x-tiergate-fallback"] == "true"
        if stream:
            chunks = list(raw.parse())
            assert {c.service_tier for c in chunks} == {"default"}
        else:
            assert raw.parse().service_tier == "default"
