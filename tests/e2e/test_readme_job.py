"""The README's agent-job example, verbatim, through the pieces ``tiergate up`` runs: the
durable object store and broker and a ``tiergate worker`` process (``local_jobs``), the
gateway, and the real model on both tiers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import VllmServer
from tests.servers import free_port, gateway_settings, running_gateway
from tiergate.local.jobs import LocalPorts, local_jobs
from tiergate.tiers import Tier

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_job_body() -> dict[str, object]:
    """The JSON body of the first ``curl .../v1/jobs ... -d '...'`` in the README."""
    found = re.search(
        r"curl http://127\.0\.0\.1:8000/v1/jobs [^\n]*-d '(\{.*?\})'", README.read_text(), re.S
    )
    assert found, "the README has no job example"
    body: dict[str, object] = json.loads(found.group(1))
    return body


@pytest.mark.e2e
def test_the_readme_job_example_runs_on_the_local_stack(
    vllm_servers: dict[Tier, VllmServer], tmp_path: Path
) -> None:
    port = free_port()
    settings = gateway_settings(
        [vllm_servers[Tier.STANDARD].url],
        [vllm_servers[Tier.FAST].url],
        gateway={"port": port, "log_requests": False},
        timeouts={"first_byte_seconds": 120.0},
    )
    ports = LocalPorts(s3=free_port(), broker=free_port(), worker_health=free_port())
    with local_jobs(
        settings, tmp_path / "logs", print, data=tmp_path / "data", ports=ports
    ) as jobs:
        settings = settings.model_copy(update={"jobs": jobs})
        with running_gateway(settings, port=port) as base:
            resp = httpx.post(f"{base}/v1/jobs", json=readme_job_body())
            assert resp.status_code == 200, resp.text
            job = resp.json()
            assert job["status"] == "queued" and job["metadata"] == {"ticket": "ABC-1"}
            # The event stream ends with the job's terminal event.
            with httpx.stream("GET", f"{base}/v1/jobs/{job['id']}/events", timeout=400) as stream:
                lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
            assert lines[-1] == "data: [DONE]"
            last = json.loads(lines[-2][6:])
            assert last["type"] in ("job.completed", "job.incomplete"), last
            final = httpx.get(f"{base}/v1/jobs/{job['id']}").json()
            assert final["result"] is not None and final["steps"] >= 1
            assert httpx.get(f"http://127.0.0.1:{ports.worker_health}/healthz").status_code == 200
