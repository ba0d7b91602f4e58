"""Schemathesis fuzzes the gateway's OpenAPI description, generated from OpenAI's and
vLLM's request and response types, against a real gateway over FakeVllm: no 5xx, no valid
request refused (the fakes accept any JSON, so a refusal is the gateway's own), and no
status, content type, body or stream event outside the documented shapes.

It runs as the schemathesis command (its pytest plugin does not load under this pytest),
and a test fails when the command reports any failure. The examples and fuzzing phases
only: the coverage phase enumerates every keyword of OpenAI's schemas (thousands of cases
per operation) and does not fit the time a test may take.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx

from tests.fakes.fake_vllm import FakeVllm
from tests.fault.openapi_fuzz_hooks import POOLING_MODEL
from tests.jobstack import jobs_stack
from tests.servers import gateway_settings, running_gateway
from tiergate.gateway.openai.routes import ROUTES

REPO = Path(__file__).resolve().parents[2]

CHECKS = (
    "not_a_server_error,status_code_conformance,content_type_conformance,"
    "response_schema_conformance,positive_data_acceptance"
)

# The jobs routes refuse much that their schema allows (caps, uploads that do not exist, a
# model not served, a batch naming an upload of another key): every refusal must be a
# documented 4xx in the error envelope, but a refusal of schema-valid data is no failure.
JOBS_CHECKS = (
    "not_a_server_error,status_code_conformance,content_type_conformance,"
    "response_schema_conformance"
)

PROXIED = "^(?:" + "|".join(re.escape(path) for path in ROUTES) + ")$"


def _digest(stdout: str) -> str:
    """The failures section of a report, each line cut short (bodies can be large)."""
    start = stdout.find(" FAILURES ")
    lines = stdout[max(start, 0) :].splitlines()
    return "\n".join(line[:600] for line in lines)[-30000:]


def _schemathesis(
    base: str, tmp_path: Path, select: list[str], examples: int, checks: str = CHECKS
) -> str:
    """Run schemathesis against the gateway at ``base`` over the operations ``select``
    picks; its report (the test fails on any failure it reports)."""
    schemathesis = Path(sys.executable).parent / "schemathesis"
    proc = subprocess.run(
        [
            str(schemathesis),
            "run",
            f"{base}/openapi.json",
            *select,
            "--checks",
            checks,
            "--phases",
            "examples,fuzzing",
            "--max-examples",
            str(examples),
            "--seed",
            "20261130",
            "--continue-on-failure",
            "--generation-database",
            "none",
            "--request-timeout",
            "10",
            "--output-sanitize",
            "false",
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=tmp_path,
        env={
            **os.environ,
            "PYTHONPATH": str(REPO),
            "SCHEMATHESIS_HOOKS": "tests.fault.openapi_fuzz_hooks",
        },
    )
    report = _digest(proc.stdout) + proc.stderr[-2000:]
    assert proc.returncode == 0, report
    assert "passed" in proc.stdout.lower(), report
    return proc.stdout


def _fuzz(
    fakes: list[FakeVllm], tmp_path: Path, select: list[str], examples: int
) -> tuple[str, FakeVllm]:
    """Schemathesis over a gateway with jobs off; its report, and the pooling fake (a
    generative model on both tiers, a pooling model on the standard one)."""
    pooling = FakeVllm(POOLING_MODEL, pooling=True).start()
    try:
        settings = gateway_settings([fakes[0].url, fakes[1].url, pooling.url], [fakes[2].url])
        with running_gateway(settings) as base:
            stdout = _schemathesis(base, tmp_path, select, examples)
    finally:
        pooling.stop()
    return stdout, pooling


def test_proxied_routes_conform_to_their_description(fakes: list[FakeVllm], tmp_path: Path) -> None:
    stdout, pooling = _fuzz(fakes, tmp_path, ["--include-path-regex", PROXIED], 30)
    # Every route of the table was fuzzed, and the requests reached the fakes behind it.
    assert f"Tested: {len(ROUTES)}" in stdout, stdout[-3000:]
    assert sum(f.record.requests for f in fakes) > 0, stdout[-3000:]
    assert pooling.record.requests > 0, stdout[-3000:]


def test_other_routes_conform_to_their_description(fakes: list[FakeVllm], tmp_path: Path) -> None:
    stdout, _ = _fuzz(fakes, tmp_path, ["--exclude-path-regex", PROXIED], 25)
    # The models, tiers and ops routes were all exercised (none skipped); the jobs routes
    # answer 404 jobs_disabled here, and are fuzzed with jobs on below.
    tested = re.search(r"Tested: (\d+)", stdout)
    selected = re.search(r"Selected: (\d+)/", stdout)
    assert tested and selected and tested.group(1) == selected.group(1), stdout[-3000:]
    assert int(tested.group(1)) >= 10, stdout[-3000:]


def test_the_jobs_routes_conform_to_their_description(
    broker: str, s3: str, fakes: list[FakeVllm], tmp_path: Path
) -> None:
    """The jobs API, the largest surface a tenant reaches, on a gateway with jobs on and a
    real broker (Tansu) and store (SeaweedFS) behind it: every jobs, uploads and batches
    operation, and OpenAI's files and batches routes, fuzzed, no 5xx, every answer as described. No
    worker runs: what is accepted stays queued."""
    with jobs_stack(broker, s3, fakes[0], tmp_path) as stack:
        stdout = _schemathesis(
            stack.base,
            tmp_path,
            ["--include-path-regex", "^/v1/(jobs|files|batches)"],
            20,
            JOBS_CHECKS,
        )
        listed = httpx.get(f"{stack.base}/v1/jobs?limit=100").json()["data"]
    tested = re.search(r"Tested: (\d+)", stdout)
    selected = re.search(r"Selected: (\d+)/", stdout)
    assert tested and selected and tested.group(1) == selected.group(1), stdout[-3000:]
    # 12 jobs operations, 5 of files, 4 of batches
    assert int(tested.group(1)) >= 21, stdout[-3000:]
    # Some generated jobs were valid and accepted (the fuzz reached past validation).
    assert listed, stdout[-3000:]
