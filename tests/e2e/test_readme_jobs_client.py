"""The README's ``tiergate jobs`` and ``JobsClient`` examples and the manual's Batch API
example, verbatim, against the pieces
``make up`` runs: the object store, the broker and a ``tiergate worker`` (``local_jobs``),
the gateway and the real model on both tiers. The examples read ``TIERGATE_BASE_URL``
(default http://127.0.0.1:8000, where ``make up`` serves); the test points it at its own
gateway."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import VllmServer
from tests.readme_blocks import assert_node_batch_guide, run_readme_block
from tests.servers import free_port, gateway_settings, running_gateway
from tiergate.local.jobs import LocalPorts, local_jobs
from tiergate.tiers import Tier

ENDED = ("completed", "incomplete")


@pytest.mark.e2e
def test_the_readme_jobs_client_examples_run_on_the_local_stack(
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
            cli = run_readme_block("jobs-cli", base, tmp_path)
            # 0: completed and passed; 1: ended otherwise (the small model may not solve it).
            assert cli.returncode in (0, 1), cli.stderr
            job = json.loads(cli.stdout)
            assert job["status"] in ENDED and job["metadata"] == {"ticket": "ABC-1"}, job
            assert job["result"] is not None and job["steps"] >= 1
            passed = job["status"] == "completed" and job["result"]["passed"]
            assert cli.returncode == (0 if passed else 1)
            progress = cli.stderr.splitlines()
            assert progress[0] == f"[{job['id']}] submitted", cli.stderr
            assert f"[{job['id']}] queued" in progress
            assert any(line.startswith(f"[{job['id']}] step 1: ") for line in progress)

            python = run_readme_block("jobs-python", base, tmp_path)
            assert python.returncode == 0, python.stderr
            lines = python.stdout.splitlines()
            assert lines[0].split() == ["job.queued"] and "job.step" in python.stdout, lines
            final = lines[-1].split()
            assert final[0] in ENDED and final[-1].startswith("http"), lines  # the trajectory

            # The manual's Batch API example (docs/files.md), as OpenAI's guide runs it: its
            # lines answered by the real model through the local stack's worker.
            batch = run_readme_block("batch-python", base, tmp_path)
            assert batch.returncode == 0, batch.stderr
            said = batch.stdout.splitlines()
            assert said[0].startswith("completed ") and "completed=3" in said[0], said
            answered = sorted(line.split()[0] for line in said if line.startswith("request-"))
            assert answered == ["request-1", "request-2", "request-3"], said

            # The same guide with the official Node client, whole: the output and error
            # files, the list and a cancel.
            node = run_readme_block("batch-node", base, tmp_path)
            assert node.returncode == 0, node.stderr
            assert_node_batch_guide(node.stdout)
