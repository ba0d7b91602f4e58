"""One engine or both for the two tiers, measured (tiergate/tuning/layout.py), with fake
engines whose cost model is set: a fake that serves one request at a time gains from a
second engine, a fake that batches for free does not. What a real CPU does is the
benchmark's to find; here the measurement and the choice it makes are the machinery."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tiergate.fastfit import shared_pools
from tiergate.settings import Settings, load_settings
from tiergate.tiers import Tier
from tiergate.tuning import layout as layouts


@pytest.fixture
def two_fakes() -> Iterator[list[FakeVllm]]:
    servers = [FakeVllm().start() for _ in range(2)]
    for server in servers:
        server.behaviour.chunks = 8
        server.behaviour.chunk_delay = 0.05
    yield servers
    for server in servers:
        server.stop()


def _settings(tmp_path: Path) -> Settings:
    return load_settings(
        tuning={"decision_file": str(tmp_path / "tier-decision.json"), "layout_concurrency": 4}
    )


def test_a_second_engine_serves_where_it_adds_throughput_and_not_where_it_does_not(
    two_fakes: list[FakeVllm], tmp_path: Path
) -> None:
    settings = _settings(tmp_path)
    urls = [f.url for f in two_fakes]
    # One sequence at a time, 0.3 s of prefill each: four requests take almost twice as
    # long on one engine as split over two.
    for fake in two_fakes:
        fake.behaviour.slots = 1
        fake.behaviour.delay_per_prompt_char = 0.3 / 40
    serial = layouts.measure_layout(settings, *urls, MODEL, lambda m: None, rounds=2)
    assert serial.engines == "both" and serial.ratio > 1.3, serial
    # Batching for free: four at once cost what one does, so a second engine adds nothing.
    for fake in two_fakes:
        fake.behaviour.slots = 0
        fake.behaviour.delay_per_prompt_char = 0.0
    free = layouts.measure_layout(settings, *urls, MODEL, lambda m: None, rounds=2)
    assert free.engines == "one" and free.ratio < 1.1, free
    assert free.one_engine_tokens_per_s > 0 and free.concurrency == 4


def test_the_layout_is_kept_and_reused_until_the_engines_configuration_changes(
    two_fakes: list[FakeVllm], tmp_path: Path
) -> None:
    settings = _settings(tmp_path)
    urls = [f.url for f in two_fakes]
    said: list[str] = []
    first = layouts.ensure_layout(settings, *urls, MODEL, said.append)
    assert (tmp_path / layouts.LAYOUT_FILE).is_file()
    requests = [f.record.requests for f in two_fakes]
    assert layouts.ensure_layout(settings, *urls, MODEL, said.append) == first
    assert [f.record.requests for f in two_fakes] == requests  # reused: nothing sent
    assert "reusing the engine layout" in said[-1]
    fast = settings.profiles[Tier.FAST].model_copy(update={"cpu_cores": "0-1"})
    moved = settings.model_copy(update={"profiles": {**settings.profiles, Tier.FAST: fast}})
    assert layouts.stored_layout(moved) is None  # another configuration: measured again


def test_one_engine_serves_both_tiers_when_the_layout_says_one(tmp_path: Path) -> None:
    from tests.unit.test_tuning import _decision  # the unit tests' decision builder
    from tiergate.measure.fingerprint import hardware_fingerprint

    settings = _settings(tmp_path)
    decision = _decision(settings, hardware_fingerprint(settings.gpu_name)).model_copy(
        update={"chosen": None}
    )
    urls = {Tier.STANDARD: "http://127.0.0.1:8101", Tier.FAST: "http://127.0.0.1:8102"}
    fast = settings.profiles[Tier.FAST]
    base = dict(
        one_engine_tokens_per_s=100.0,
        two_engines_tokens_per_s=70.0,
        ratio=0.7,
        concurrency=8,
        rounds=3,
        measured_at=0.0,
        fingerprint={},
        fingerprint_digest="",
        config_digest="",
    )
    one = layouts.EngineLayout(engines="one", **base)  # type: ignore[arg-type]
    served = shared_pools(settings, decision, fast, urls, one)
    assert served.tiers[Tier.STANDARD].endpoints == [urls[Tier.STANDARD]]
    assert served.tiers[Tier.FAST].endpoints == [urls[Tier.STANDARD]]
    both = one.model_copy(update={"engines": "both"})
    served = shared_pools(settings, decision, fast, urls, both)
    assert served.tiers[Tier.STANDARD].endpoints == [urls[Tier.STANDARD], urls[Tier.FAST]]
