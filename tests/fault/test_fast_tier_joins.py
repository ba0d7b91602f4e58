"""``make up`` serves before its fast tier is proven (tiergate.fitting, issue 53): until
the fast tier joins, its requests are served by the standard tier and say why, ``GET
/v1/tiers`` shows the fitting's progress, and no request goes to an engine not yet proven;
the join happens in the running gateway without failing a request. A real gateway over
fake vLLM servers (tests/fakes/fake_vllm.py); the stack's own fitting, with real engines:
tests/e2e/test_local_stack.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.fakes.fake_vllm import MODEL, FakeVllm
from tests.servers import gateway_settings, running_gateway
from tests.waiting import eventually
from tiergate.fitting import Fitting, Joined, read_progress, write_progress
from tiergate.tiers import Tier


def _chat(base: str, tier: str | None, stream: bool = False) -> httpx.Response:
    body: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": stream,
    }
    if tier is not None:
        body["service_tier"] = tier
    return httpx.post(f"{base}/v1/chat/completions", json=body, timeout=10)


@contextmanager
def _traffic(base: str) -> Iterator[list[tuple[int, str]]]:
    """Priority requests, streamed and not, one after another for as long as the block
    runs: each one's status and tier."""
    seen: list[tuple[int, str]] = []
    stop = threading.Event()

    def send() -> None:
        n = 0
        while not stop.is_set():
            answer = _chat(base, "priority", stream=n % 2 == 1)
            seen.append((answer.status_code, answer.headers.get("x-tiergate-tier", "")))
            n += 1

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(15)


def _fast_of(base: str) -> dict[str, Any]:
    tiers = httpx.get(f"{base}/v1/tiers", timeout=5).json()
    (fast,) = [t for t in tiers["data"] if t["tier"] == "fast"]
    assert isinstance(fast, dict)
    return {**fast, "_decision": tiers["decision"]}


def test_the_fast_tier_joins_a_serving_gateway_without_a_failed_request(
    fakes: list[FakeVllm], tmp_path: Path
) -> None:
    progress = tmp_path / "tuning-progress.json"
    write_progress(
        progress,
        {
            "candidate": 1,
            "of": 3,
            "doing": "W8A8-sq-gptq + ngram",
            "estimated_seconds_left": 600,
            "results": [],
        },
    )
    fitting = Fitting(progress)
    # As the local stack starts it: the fast tier's pool empty until it joins.
    settings = gateway_settings([fakes[0].url], [])
    with running_gateway(settings, fitting=fitting) as base, _traffic(base) as seen:
        for stream in (False, True):
            answer = _chat(base, "priority", stream)
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-tiergate-tier"] == "standard"
            assert answer.headers["x-tiergate-tier-reason"] == "fitting"
        assert _chat(base, "priority").json()["service_tier"] == "default"
        auto = _chat(base, None)  # headroom on a fast tier that is not there: standard
        assert auto.status_code == 200 and auto.headers["x-tiergate-tier"] == "standard"

        fast = _fast_of(base)
        assert fast["fitting"]["state"] == "tuning", fast
        assert fast["fitting"]["tuning"]["candidate"] == 1
        assert fast["fitting"]["tuning"]["of"] == 3
        assert 580 <= fast["fitting"]["tuning"]["estimated_seconds_left"] <= 600
        assert fast["_decision"] is None and "engine_mode" not in fast

        fitting.enter("starting", "starting the fast engine")
        assert _fast_of(base)["fitting"]["state"] == "starting"
        assert fakes[2].record.bodies == []  # nothing reached the fast engine before the join

        fitting.join(
            Joined(
                endpoints={Tier.STANDARD: [fakes[0].url], Tier.FAST: [fakes[2].url]},
                engine_modes={Tier.FAST: "compiled"},
            )
        )

        def fast_serves() -> bool:
            answer = _chat(base, "priority")
            assert answer.status_code == 200, answer.text
            return answer.headers["x-tiergate-tier"] == "fast"

        eventually(fast_serves, 10, 0.1, "the fast tier serving after its join")
        eventually(lambda: sum(1 for _, t in seen if t == "fast") >= 3, 10, 0.05, "traffic")
        joined = _fast_of(base)
        assert "fitting" not in joined and joined["engine_mode"] == "compiled", joined
        assert "x-tiergate-tier-reason" in _chat(base, "priority").headers
    statuses = [status for status, _ in seen]
    assert statuses and all(s == 200 for s in statuses), statuses
    tiers = [tier for _, tier in seen]
    first_fast = tiers.index("fast")
    assert set(tiers[:first_fast]) == {"standard"} and set(tiers[first_fast:]) == {"fast"}


def test_the_tuners_estimate_counts_down_between_its_writes(tmp_path: Path) -> None:
    path = tmp_path / "tuning-progress.json"
    write_progress(path, {"candidate": 2, "estimated_seconds_left": 300, "elapsed_seconds": 60})
    written = path.stat().st_mtime
    later = read_progress(path, now=written + 100)
    assert later is not None
    assert (later["estimated_seconds_left"], later["elapsed_seconds"]) == (200, 160)
    assert later["updated_seconds_ago"] == 100
    assert read_progress(path, now=written + 1000)["estimated_seconds_left"] == 0  # type: ignore[index]
    path.write_text("{torn")
    assert read_progress(path) is None


def test_a_fitting_that_fails_leaves_the_standard_tier_serving_and_says_why(
    fakes: list[FakeVllm], tmp_path: Path
) -> None:
    fitting = Fitting(tmp_path / "none.json")
    settings = gateway_settings([fakes[0].url], [])
    with running_gateway(settings, fitting=fitting) as base:
        fitting.fail("the fast tier failed its parity check")
        answer = _chat(base, "priority")
        assert answer.status_code == 200
        assert answer.headers["x-tiergate-tier"] == "standard"
        assert answer.headers["x-tiergate-tier-reason"] == "unfitted"
        fast = _fast_of(base)
        assert fast["fitting"]["state"] == "failed"
        assert "parity" in fast["fitting"]["detail"]
        assert "tuning" not in fast["fitting"]
