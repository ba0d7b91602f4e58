"""``tiergate bench urgency`` runs end to end against fake engines: the machinery and the
ordering the gateway itself decides, not the engines' speed.

The fakes stream every request at the same pace whatever its ``priority``, so what orders
the backlog here is the gateway alone: a ``priority`` request goes to the fast tier's gate
(empty) and a ``flex`` one waits behind every queued standard request in the standard
tier's gate."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tiergate.bench.report import write_report
from tiergate.bench.urgency.bench import UrgencyBenchParams, bench_urgency
from tiergate.bench.urgency.gateway import UrgencyBenchError
from tiergate.bench.urgency.report import command_line, render_urgency

CHUNKS = 8
DELAY = 0.1


@pytest.fixture
def engines() -> Iterator[list[FakeVllm]]:
    servers = [FakeVllm().start() for _ in range(2)]
    for server in servers:
        server.behaviour.chunks = CHUNKS
        server.behaviour.chunk_delay = DELAY
        # Each prompt of its own length (0.17 to 0.33 s before the first chunk), so that two
        # requests never free their slots in the same moment: the last standard request
        # and the flex one are never admitted together, and their order is the gateway's.
        server.behaviour.slots = 64
        server.behaviour.delay_per_prompt_char = 0.005
    yield servers
    for server in servers:
        server.stop()


def test_the_urgency_bench_orders_the_backlog_and_writes_its_report(
    engines: list[FakeVllm], tmp_path: Path
) -> None:
    params = UrgencyBenchParams(
        engines=tuple(e.url for e in engines), model=MODEL, capacity=2, backlog=5, rounds=2
    )
    lines: list[str] = []
    result = bench_urgency(params, progress=lines.append)

    assert result["gateway"]["engine_priorities"] is True
    assert result["gateway"]["standard_endpoints"] == [e.url for e in engines]
    assert result["gateway"]["fast_endpoints"] == [e.url for e in engines][::-1]
    assert result["gateway"]["standard_max_concurrent"] == 2
    assert len(result["per_round"]) == 2
    for round_ in result["per_round"]:
        backlog = round_["backlog"]
        # Sent once both admitted requests had their first token: the other three queued.
        assert backlog["queued_when_priority_sent"] == 3
        assert backlog["queued_standard_first_before_priority"] == 0
        # (Its TTFT against the idle figure is the report's, not asserted here: a timed
        # bound would test this shared machine; the order above is the machinery's.)
        assert backlog["priority_ttft_vs_idle"] > 0
        assert backlog["standard_first_after_flex"] == 0
        assert backlog["standard_without_first_token"] == 0
        assert backlog["as_planned"] is True
        kinds = Counter(s["service_tier"] for s in backlog["samples"])
        assert kinds == {"default": 5, "priority": 1, "flex": 1}
        # The figures are the samples': the flex request's first token is the last one.
        firsts = [s["first_token_s"] for s in backlog["samples"]]
        flex = next(s for s in backlog["samples"] if s["service_tier"] == "flex")
        assert flex["first_token_s"] == max(firsts)
        assert backlog["flex_first_after_last_standard_ms"] > 0
        assert set(round_["shared_in_flight_per_engine"]) == {e.url for e in engines}
        # Each batch: 2 requests of CHUNKS tokens, in at least CHUNKS - 1 chunk delays.
        assert 0 < round_["single_tokens_per_s"] <= 2 * CHUNKS / (DELAY * (CHUNKS - 1))

    summary = result["summary"]
    assert summary["most_queued_standard_first_before_priority"] == 0
    assert summary["rounds_as_planned"] == 2
    assert summary["targets"]["flex_last"]["met"] is True
    assert set(summary["targets"]) == {"shared_engines", "priority_first", "flex_last"}

    # The engines were asked with vLLM's priority: the gateway set it from the tier asked.
    sent = Counter(b.get("priority") for e in engines for b in e.record.bodies)
    assert sent[0] == 2 * 2  # the idle and the backlog priority request, each round
    assert sent[2] == 2 * 2  # the same for flex
    assert sent[None] == 2 * 2  # the single-engine batches, straight to the engine
    assert sent[1] == 2 + 2 * (2 + 5)  # the checks, the shared batches and the backlogs
    assert any("round 2/2" in line for line in lines)

    markdown = render_urgency(result, command_line(params))
    write_report(tmp_path, "urgency-bench", result, markdown)
    assert json.loads((tmp_path / "urgency-bench.json").read_text())["capacity"] == 2
    assert "--capacity 2 --backlog 5" in markdown
    assert result["hardware"]["cpu"] in markdown
    assert markdown.count("\n| 1 |") == 1 and markdown.count("\n| 2 |") == 1


def test_an_engine_without_priority_scheduling_stops_the_bench(
    engines: list[FakeVllm],
) -> None:
    engines[1].behaviour.refuses_priority = True
    params = UrgencyBenchParams(engines=tuple(e.url for e in engines), model=MODEL, capacity=2)
    with pytest.raises(UrgencyBenchError, match="--scheduling-policy priority") as caught:
        bench_urgency(params, progress=lambda _: None)
    assert engines[1].url in str(caught.value)
    assert engines[0].record.requests == 1  # only the check: nothing was measured
