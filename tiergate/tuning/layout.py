"""One engine or two for both tiers, when the fast tier runs the standard configuration.

With the verdict ``equal`` (no recipe beats the standard configuration) the local stack has
two engines of the same configuration, one per core. Whether both should serve depends on
the processor: where batching costs a CPU engine little (a compiled engine on an Intel
Xeon with AVX-512: 8 requests at once ran at about 1.7x the output tokens/s of 4), a second
engine on the second core only takes that core from the first engine's own processes (its
scheduler, its API server, the gateway), and two engines together measured 0.6-0.8x one;
where a batch costs nearly its size (eager engines on an AMD EPYC with AVX2 only), two
engines measured 1.3-1.7x one. So it is measured here, in the serving mode, with the two
running engines: ``concurrency`` streamed requests to one engine against the same number
split over both, in alternating rounds. Both serve when two beat one by
``tuning.two_engines_min_gain``; otherwise one engine serves both tiers and the other is
stopped. The result is kept beside the tier decision and reused while the hardware and the
engines' configuration match.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal, TypeGuard

from pydantic import BaseModel, ValidationError

from tiergate.measure.fingerprint import digest, hardware_fingerprint
from tiergate.measure.stream import run_level
from tiergate.settings import Settings
from tiergate.tiers import Tier

Progress = Callable[[str], None]

LAYOUT_FILE = "engine-layout.json"


class EngineLayout(BaseModel):
    """The measured choice of one engine or both for the two tiers."""

    engines: Literal["one", "both"]
    one_engine_tokens_per_s: float
    two_engines_tokens_per_s: float
    ratio: float
    concurrency: int
    rounds: int
    measured_at: float
    fingerprint: dict[str, str]
    fingerprint_digest: str
    config_digest: str


def serves_one(layout: EngineLayout | None) -> TypeGuard[EngineLayout]:
    """Whether ``layout`` (stored or just measured) says one engine serves both tiers."""
    return layout is not None and layout.engines == "one"


def config_digest(settings: Settings) -> str:
    """What the measurement answers for besides the hardware: both engines' configuration
    and the measurement's own parameters."""
    keys = ("model", "dtype", "enforce_eager", "max_model_len", "kv_cache_gib", "cpu_cores")
    profiles = {
        tier.value: [getattr(settings.profiles[tier], k) for k in keys]
        for tier in (Tier.STANDARD, Tier.FAST)
    }
    t = settings.tuning
    return digest({"profiles": profiles, "measure": [t.layout_concurrency, t.two_engines_min_gain]})


def layout_path(settings: Settings) -> Path:
    return settings.tuning.decision_path().parent / LAYOUT_FILE


def stored_layout(settings: Settings) -> EngineLayout | None:
    """The stored measurement if it holds for this machine and configuration."""
    try:
        layout = EngineLayout.model_validate_json(layout_path(settings).read_text())
    except (OSError, ValidationError, ValueError):
        return None
    if layout.fingerprint_digest != digest(hardware_fingerprint(settings.gpu_name)):
        return None
    return layout if layout.config_digest == config_digest(settings) else None


def _tokens_per_s(urls: list[str], model: str, concurrency: int, max_tokens: int) -> float:
    share = [concurrency // len(urls) + (i < concurrency % len(urls)) for i in range(len(urls))]

    async def run() -> float:
        started = time.perf_counter()
        results = await asyncio.gather(
            *(
                run_level(f"{url}/v1/chat/completions", model, None, n, n, max_tokens)
                for url, n in zip(urls, share, strict=True)
                if n
            )
        )
        wall = time.perf_counter() - started
        return sum(s.tokens for samples, _ in results for s in samples) / wall

    return asyncio.run(run())


def measure_layout(
    settings: Settings,
    standard_url: str,
    fast_url: str,
    model: str,
    progress: Progress,
    *,
    rounds: int = 3,
    max_tokens: int = 64,
) -> EngineLayout:
    """Measure one engine against both (``tuning.layout_concurrency`` requests each time)."""
    concurrency = settings.tuning.layout_concurrency
    one: list[float] = []
    two: list[float] = []
    for round_ in range(rounds):
        order = [(one, [standard_url]), (two, [standard_url, fast_url])]
        for figures, urls in order if round_ % 2 == 0 else order[::-1]:
            figures.append(_tokens_per_s(urls, model, concurrency, max_tokens))
        progress(
            f"engine layout, round {round_ + 1}/{rounds}: {concurrency} requests on one engine "
            f"{one[-1]:.1f} tokens/s, split over two {two[-1]:.1f}"
        )
    one_figure, two_figure = statistics.median(one), statistics.median(two)
    ratio = two_figure / max(one_figure, 1e-9)
    fingerprint = hardware_fingerprint(settings.gpu_name)
    return EngineLayout(
        engines="both" if ratio >= settings.tuning.two_engines_min_gain else "one",
        one_engine_tokens_per_s=round(one_figure, 1),
        two_engines_tokens_per_s=round(two_figure, 1),
        ratio=round(ratio, 3),
        concurrency=concurrency,
        rounds=rounds,
        measured_at=time.time(),
        fingerprint=fingerprint,
        fingerprint_digest=digest(fingerprint),
        config_digest=config_digest(settings),
    )


def ensure_layout(
    settings: Settings, standard_url: str, fast_url: str, model: str, progress: Progress
) -> EngineLayout:
    """The stored layout when it holds, else measured now and stored."""
    layout = stored_layout(settings)
    if layout is not None:
        progress(
            f"reusing the engine layout measured "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(layout.measured_at))}: "
            f"{layout.engines} ({layout.ratio:.2f}x for two engines)"
        )
        return layout
    progress(
        "measuring whether a second engine of the standard configuration adds throughput "
        "on this machine (one engine against two, in the serving mode)"
    )
    layout = measure_layout(settings, standard_url, fast_url, model, progress)
    path = layout_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(layout.model_dump_json(indent=2))
    return layout
