"""The gateway loads what it serves (issue 36): importing the app, and building it with
jobs off, loads no sandbox, environment, tuning or quantization module and neither kafka
nor boto3. Run in a fresh interpreter, since this one has imported everything already."""

from __future__ import annotations

import json
import subprocess
import sys

_PROBE = """
import json, sys
import tiergate.gateway.app as app
from tiergate.settings import load_settings
app.create_app(load_settings())
print(json.dumps(sorted(sys.modules)))
"""
# Never in a gateway without jobs: what only workers, the tuner or the jobs API need.
FORBIDDEN = (
    "tiergate.sandbox",
    "tiergate.envs",
    "tiergate.tuning",
    "tiergate.quant",
    "tiergate.jobs",
    "tiergate.queue",
    "tiergate.objectstore",
    "kafka",
    "boto3",
    "botocore",
    "torch",
    "vllm",
)


def _loaded(probe: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    loaded: list[str] = json.loads(done.stdout.splitlines()[-1])
    return loaded


def test_the_gateway_without_jobs_loads_no_worker_tuner_or_jobs_module() -> None:
    loaded = _loaded(_PROBE)
    assert "tiergate.gateway.openai.proxy" in loaded  # the probe did import the gateway
    found = sorted(m for m in loaded if any(m == f or m.startswith(f + ".") for f in FORBIDDEN))
    assert not found, f"the gateway imported what it does not serve: {found}"


def test_jobs_on_loads_the_jobs_api_and_still_no_sandbox() -> None:
    probe = _PROBE.replace(
        "app.create_app(load_settings())",
        "from tiergate.gateway.jobs.wiring import build_jobs",
    )
    loaded = _loaded(probe)
    assert {"kafka", "boto3", "tiergate.jobs.state.store"} <= set(loaded)
    assert not [m for m in loaded if m.startswith(("tiergate.sandbox", "tiergate.envs"))]
