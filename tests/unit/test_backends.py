from __future__ import annotations

import pytest

from tests.waiting import eventually
from tiergate.backends.endpoint import Endpoint, LoadSignals
from tiergate.backends.loadstats import parse_load_signals
from tiergate.backends.routing import LoadAwareRouter, PrefixAffinity
from tiergate.engine.command import vllm_command, vllm_environment
from tiergate.settings import load_settings
from tiergate.tiers import Tier

METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:num_requests_waiting{engine="1",model_name="m"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="m"} 0.0
"""


def test_parse_load_signals_sums_engines() -> None:
    assert parse_load_signals(METRICS) == LoadSignals(running=3.0, waiting=3.0, kv_cache_usage=0.25)
    assert parse_load_signals("") == LoadSignals()


def test_passive_ejection_and_cooldown() -> None:
    ep = Endpoint("http://a", Tier.FAST, eject_after_failures=2, cooldown_seconds=0.2)
    assert not ep.record_failure() and ep.available()
    assert ep.record_failure() and not ep.available()
    assert eventually(ep.available, 5, 0.01, "the cool-down over")  # half-open: tried again
    assert ep.record_failure() and not ep.available()  # still failing: ejected at once
    ep.record_success()
    assert ep.consecutive_failures == 0


def _eps(*loads: float) -> list[Endpoint]:
    return [
        Endpoint(f"http://e{i}", Tier.STANDARD, in_flight=int(load)) for i, load in enumerate(loads)
    ]


def test_router_prefers_least_loaded() -> None:
    router = LoadAwareRouter(PrefixAffinity(10), load_slack=2)
    eps = _eps(5, 0, 3)
    assert all(router.choose(eps, None).url == "http://e1" for _ in range(5))


def test_scraped_load_counts_other_replicas() -> None:
    eps = _eps(0, 1)
    eps[0].load = LoadSignals(running=4, waiting=2)
    router = LoadAwareRouter(PrefixAffinity(10), load_slack=0)
    assert router.choose(eps, None).url == "http://e1"


def test_affinity_sticks_until_load_differs_by_more_than_slack() -> None:
    router = LoadAwareRouter(PrefixAffinity(10), load_slack=2)
    eps = _eps(0, 0)
    first = router.choose(eps, prefix_key=42)
    for ep in eps:
        if ep is first:
            ep.in_flight = 2
    assert router.choose(eps, prefix_key=42) is first  # within slack: cache wins
    first.in_flight = 5
    other = router.choose(eps, prefix_key=42)
    assert other is not first  # overloaded: load wins
    assert router.choose(eps, prefix_key=42) is other  # and affinity moved with it


def test_affinity_map_is_bounded() -> None:
    affinity = PrefixAffinity(max_entries=100)
    for key in range(10_000):
        affinity.put(key, "http://e0")
    assert len(affinity) == 100
    assert affinity.get(0) is None and affinity.get(9_999) == "http://e0"


def test_fast_profile_renders_speculative_config() -> None:
    from tiergate.tuning.profiles import recipe_profile

    settings = load_settings()
    ngram = next(r for r in settings.tuning.candidates if r.name == "bf16 + ngram")
    profile = recipe_profile(
        settings.profiles[Tier.FAST], ngram, settings.profiles[Tier.STANDARD].model
    )
    cmd = vllm_command(profile, python="/venv/bin/python")
    assert cmd[:3] == ["/venv/bin/python", "-m", "tiergate.engine.vllm_launch"]
    spec = cmd[cmd.index("--speculative-config") + 1]
    assert '"method":"ngram"' in spec and '"num_speculative_tokens":3' in spec
    assert cmd[cmd.index("--served-model-name") + 1] == "SmolLM2-135M-Instruct"
    env = vllm_environment(profile)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["VLLM_CPU_OMP_THREADS_BIND"] == "1"


async def _routes_seen(openapi_answer: tuple[int, str]) -> tuple[frozenset[str] | None, int]:
    """What a pool learns of a server's routes from its /openapi.json answer, and how many
    times it asked over three health rounds."""
    import aiohttp
    from aiohttp import web

    from tiergate.backends.pool import TierPool
    from tiergate.settings import HealthSettings, PoolSettings, RoutingSettings

    asked = 0

    async def openapi(request: web.Request) -> web.Response:
        nonlocal asked
        asked += 1
        status, text = openapi_answer
        return web.Response(status=status, text=text, content_type="application/json")

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"data": []})

    app = web.Application()
    app.router.add_get("/openapi.json", openapi)
    app.router.add_get("/{tail:.*}", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    async with aiohttp.ClientSession() as session:
        pool = TierPool(
            Tier.STANDARD,
            PoolSettings(endpoints=[f"http://127.0.0.1:{port}"]),
            HealthSettings(),
            RoutingSettings(),
            session,
        )
        for _ in range(3):
            await pool.check_all()
        (ep,) = pool.endpoints.values()
        await runner.cleanup()
        return ep.routes, asked


async def test_routes_learned_once_from_a_real_description() -> None:
    described = '{"paths": {"/v1/chat/completions": {"post": {}}, "/health": {"get": {}}}}'
    assert await _routes_seen((200, described)) == (frozenset({"/v1/chat/completions"}), 1)


async def test_a_server_answering_every_path_alike_leaves_routes_unknown() -> None:
    # A stand-in backend (the benchmark's nginx) answers /openapi.json with a completion: no
    # routes learned (all assumed served), and not asked again every health round.
    assert await _routes_seen((200, '{"id": "x", "choices": []}')) == (None, 1)
    assert await _routes_seen((404, '{"detail": "Not Found"}')) == (None, 1)


def test_the_launcher_lets_a_cpu_engine_load_its_compile_cache() -> None:
    """vLLM's loader calls finalize_loading on what it loaded; on CPU that is torch's
    bundled callable, which lacks it (tiergate.engine.vllm_launch): the launcher adds a
    no-op, once, and the module is what the engines run."""
    from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable

    from tiergate.engine import vllm_launch

    assert "finalize_loading" in vars(BundledAOTAutogradSerializableCallable)
    assert vllm_launch.patch_finalize_loading() is False  # already there: not patched twice
    assert BundledAOTAutogradSerializableCallable.finalize_loading(object(), None) is None


def test_engines_pinned_to_other_cores_share_one_compile_cache_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM keys its compile cache on every VLLM_* variable, the core binding among them;
    the launcher keys it on the count of cores instead, so the local stack's two engines of
    one configuration (cores 0 and 1) compile once."""
    import vllm.envs as vllm_envs

    from tiergate.engine import vllm_launch

    assert vllm_launch.patch_core_binding_factor() is False  # patched at import, once
    keys = {}
    for bind in ("0", "1", "0-1", "2,3"):
        monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", bind)
        keys[bind] = vllm_envs.compile_factors()["VLLM_CPU_OMP_THREADS_BIND"]
    assert keys["0"] == keys["1"] == "cores:1"
    assert keys["0-1"] == keys["2,3"] == "cores:2"
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "auto")
    assert vllm_envs.compile_factors()["VLLM_CPU_OMP_THREADS_BIND"] == "auto"
    assert vllm_launch._cores_named("0-1|2-3") == "2|2"
