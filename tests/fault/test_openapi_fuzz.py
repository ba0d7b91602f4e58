"""Schemathesis fuzzes the gateway's OpenAPI description against a real gateway over
FakeVllm: no 5xx, and no status, content type or body outside the documented shapes.

It runs as the schemathesis command (its pytest plugin does not load under this pytest),
and the test fails when the command reports any failure.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.fakes.fake_vllm import FakeVllm
from tests.servers import gateway_settings, running_gateway

CHECKS = (
    "not_a_server_error,status_code_conformance,content_type_conformance,"
    "response_schema_conformance"
)


def test_gateway_conforms_to_its_openapi(fakes: list[FakeVllm]) -> None:
    schemathesis = Path(sys.executable).parent / "schemathesis"
    settings = gateway_settings([fakes[0].url], [fakes[2].url])
    with running_gateway(settings) as base:
        proc = subprocess.run(
            [
                str(schemathesis),
                "run",
                f"{base}/openapi.json",
                "--checks",
                CHECKS,
                "--max-examples",
                "50",
                "--seed",
                "20261130",
                "--request-timeout",
                "10",
                "--no-color",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    report = proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, report
    assert "passed" in proc.stdout.lower(), report
    # The fuzzer did reach the completion routes and the backend behind them.
    assert fakes[0].record.requests > 0, report
