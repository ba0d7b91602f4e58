"""uvicorn's options from the settings, as `tiergate serve` and the local stack use them;
the exposure settings' validation; which client request ids are echoed."""

from __future__ import annotations

import resource
from typing import Any

import pytest
import uvicorn
from typer.testing import CliRunner

from tiergate import cli
from tiergate.gateway.openai.coalesce import CoalescingHttpToolsProtocol
from tiergate.gateway.openai.requestids import client_request_id
from tiergate.gateway.serving import connection_cap, uvicorn_options
from tiergate.settings import Settings, SettingsError, load_settings


def test_defaults_keep_todays_behaviour() -> None:
    gateway = load_settings().gateway
    assert gateway.docs
    # /metrics names keys and engines: on a port of its own by default, not the serving one.
    assert gateway.metrics_port == 9300 and gateway.metrics_host is None
    assert not gateway.metrics_on_serving_port
    options = uvicorn_options(gateway)
    protocol = options.pop("http")
    assert protocol.func is CoalescingHttpToolsProtocol
    assert protocol.keywords == {"header_read_timeout": 10.0} and not protocol.args
    assert options == {
        "loop": "uvloop",
        "timeout_graceful_shutdown": 30.0,
        "limit_concurrency": connection_cap(gateway),
        "timeout_keep_alive": 5.0,
        "log_config": None,
        "access_log": False,
        "proxy_headers": False,
        "server_header": False,
    }
    assert gateway.body_read_timeout_seconds == 30.0


@pytest.mark.parametrize(
    ("soft", "cap"),
    [(1024, 512), (1_048_576, 8192), (100, 64), (resource.RLIM_INFINITY, 8192)],
)
def test_unset_the_connection_cap_follows_the_open_file_limit(
    soft: int, cap: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No default leaves the serving port uncapped: half the descriptors the process may
    open, so that at the cap it still accepts, and answers 503, instead of failing to accept."""
    monkeypatch.setattr(resource, "getrlimit", lambda which: (soft, resource.RLIM_INFINITY))
    gateway = load_settings().gateway
    assert uvicorn_options(gateway)["limit_concurrency"] == cap
    assert connection_cap(load_settings(gateway={"max_connections": 50}).gateway) == 50


def test_connection_settings_reach_uvicorn_config() -> None:
    gateway = load_settings(
        gateway={
            "max_connections": 200,
            "keep_alive_seconds": 2.5,
            "shutdown_grace_seconds": 110,
            "header_read_timeout_seconds": 4.5,
        }
    ).gateway
    config = uvicorn.Config("tiergate.gateway.app:create_app", **uvicorn_options(gateway))
    assert config.limit_concurrency == 200
    assert config.timeout_keep_alive == 2.5
    assert config.timeout_graceful_shutdown == 110
    assert config.http.keywords == {"header_read_timeout": 4.5}


async def _noop_app(scope: Any, receive: Any, send: Any) -> None:
    return None


def test_event_loop_and_parser_are_uvloop_and_httptools() -> None:
    """Named, not uvicorn's "auto": both load (they are dependencies), and a config built
    from the options gets them rather than asyncio's loop and h11."""
    import uvloop
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    config = uvicorn.Config(_noop_app, **uvicorn_options(load_settings().gateway))
    config.load()
    # A partial of the class (it carries the header read timeout), called as the class.
    assert issubclass(config.http_protocol_class.func, HttpToolsProtocol)
    factory = config.get_loop_factory()
    assert factory is not None
    loop = factory()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()


def test_serve_runs_uvicorn_with_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    app_settings: dict[str, Any] = {}

    def fake_run(app: object, **kwargs: Any) -> None:
        seen.update(kwargs)

    def fake_create_app(settings: Settings) -> object:
        app_settings["gateway"] = settings.gateway
        return object()

    monkeypatch.setattr(uvicorn, "run", fake_run)
    monkeypatch.setattr("tiergate.gateway.app.create_app", fake_create_app)
    # Left alone, it would replace the root logger's handlers for the rest of the session.
    monkeypatch.setattr("tiergate.gateway.logs.configure_logging", lambda level: None)
    monkeypatch.setenv("TIERGATE_GATEWAY__MAX_CONNECTIONS", "7")
    monkeypatch.setenv("TIERGATE_GATEWAY__SHUTDOWN_GRACE_SECONDS", "115")
    monkeypatch.setenv("TIERGATE_GATEWAY__METRICS_PORT", "9124")
    result = CliRunner().invoke(cli.app, ["serve", "--host", "0.0.0.0", "--port", "9123"])
    assert result.exit_code == 0, result.output
    assert (seen["host"], seen["port"]) == ("0.0.0.0", 9123)
    # The options reach the settings the app is built from (the metrics listener's host).
    assert (app_settings["gateway"].host, app_settings["gateway"].port) == ("0.0.0.0", 9123)
    assert seen["limit_concurrency"] == 7
    assert seen["timeout_graceful_shutdown"] == 115
    assert seen["timeout_keep_alive"] == 5
    # One process by default: the app object itself, no workers, no multiprocess metrics.
    assert "workers" not in seen and "factory" not in seen
    clash = CliRunner().invoke(cli.app, ["serve", "--port", "9124"])
    assert clash.exit_code == 2 and "metrics_port" in clash.output


def test_serve_workers_runs_uvicorn_workers_with_multiprocess_metrics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os
    import pickle

    seen: dict[str, Any] = {}

    def fake_run(app: object, **kwargs: Any) -> None:
        seen.update(kwargs, app=app, folder=os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        seen["folder_existed"] = os.path.isdir(seen["folder"] or "")

    monkeypatch.setattr(uvicorn, "run", fake_run)
    monkeypatch.setattr("tiergate.gateway.logs.configure_logging", lambda level: None)
    for name in ("PROMETHEUS_MULTIPROC_DIR", "TIERGATE_GATEWAY__HOST", "TIERGATE_GATEWAY__PORT"):
        # Recorded (set, then unset), so that what `serve --workers` sets is undone after.
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    result = CliRunner().invoke(cli.app, ["serve", "--port", "9125", "--workers", "2"])
    assert result.exit_code == 0, result.output
    assert seen["app"] == "tiergate.gateway.workers:worker_app" and seen["factory"] is True
    assert (seen["workers"], seen["port"]) == (2, 9125)
    assert seen["loop"] == "uvloop" and seen["http"].func is CoalescingHttpToolsProtocol
    # The spawned workers get the options pickled: the protocol and its timeout survive.
    revived = pickle.loads(pickle.dumps(seen["http"]))
    assert revived.func is CoalescingHttpToolsProtocol
    assert revived.keywords == {"header_read_timeout": 10.0}
    # A folder of its own for the metrics files, removed when the server stops.
    assert seen["folder_existed"] and not os.path.exists(seen["folder"])
    assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == seen["folder"]  # for the workers
    # ... and --port, in the settings tree's own variable, which the workers load.
    assert os.environ["TIERGATE_GATEWAY__PORT"] == "9125"
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "")
    bad = CliRunner().invoke(cli.app, ["serve", "--workers", "0"])
    assert bad.exit_code == 2


@pytest.mark.parametrize(
    ("gateway", "named"),
    [
        ({"port": 9000, "metrics_port": 9000}, "metrics_port"),
        ({"max_connections": 0}, "max_connections"),
        ({"body_read_timeout_seconds": 0}, "body_read_timeout_seconds"),
        ({"keep_alive_seconds": 0}, "keep_alive_seconds"),
        ({"header_read_timeout_seconds": 0}, "header_read_timeout_seconds"),
        ({"shutdown_grace_seconds": -1}, "shutdown_grace_seconds"),
    ],
)
def test_exposure_settings_are_validated(gateway: dict[str, Any], named: str) -> None:
    with pytest.raises(SettingsError, match=named):
        load_settings(gateway=gateway)


def test_engine_api_key_is_kept_out_of_reprs() -> None:
    tiers = {
        "standard": {"endpoints": ["http://a:8000"], "api_key": "engine-secret"},
        "fast": {"endpoints": ["http://b:8000"]},
    }
    settings = load_settings(tiers=tiers)
    assert "engine-secret" not in repr(settings) and "engine-secret" not in str(settings)
    with pytest.raises(SettingsError, match="api_key"):
        load_settings(tiers={**tiers, "fast": {"endpoints": [], "api_key": ""}})


@pytest.mark.parametrize(
    ("value", "echoed"),
    [
        ("abc-123", "abc-123"),
        (None, None),
        ("", None),
        ("x" * 256, "x" * 256),
        ("x" * 257, None),
        ("tab\there", None),
        ("caf\u00e9", None),
    ],
)
def test_client_request_id_echoed_only_when_short_and_printable(
    value: str | None, echoed: str | None
) -> None:
    assert client_request_id(value) == echoed


async def _deadline_run(app: Any, messages: list[tuple[float, dict[str, Any]]]) -> list[str]:
    """Run ``app`` under a 0.5 s BodyReadDeadline, the client's messages arriving after
    the given delays; returns what happened, in order."""
    import asyncio

    from tiergate.gateway.errors import OpenAIError
    from tiergate.gateway.serving import BodyReadDeadline

    queue = list(messages)

    async def receive() -> dict[str, Any]:
        if not queue:
            await asyncio.sleep(3600)
        delay, message = queue.pop(0)
        await asyncio.sleep(delay)
        return message

    async def send(message: Any) -> None:
        return None

    seen: list[str] = []
    try:
        await BodyReadDeadline(app(seen), 0.5)({"type": "http"}, receive, send)
    except OpenAIError as err:
        seen.append(f"{err.status}")
    return seen


async def test_body_read_deadline_bounds_only_the_body() -> None:
    import asyncio

    def reader(seen: list[str]) -> Any:
        async def app(scope: Any, receive: Any, send: Any) -> None:
            while True:
                message = await receive()
                seen.append("part")
                if not message.get("more_body"):
                    break
            await asyncio.sleep(0.8)  # past the deadline once the body is in: no 408
            seen.append("done")

        return app

    part = {"type": "http.request", "body": b"x", "more_body": True}
    last = {"type": "http.request", "body": b"x", "more_body": False}
    # In parts within the deadline, then slow work: served.
    assert await _deadline_run(reader, [(0.0, part), (0.03, last)]) == ["part", "part", "done"]
    # The rest of the body never comes: 408 from the waiting receive.
    assert await _deadline_run(reader, [(0.0, part)]) == ["part", "408"]

    def busy_then_read(seen: list[str]) -> Any:
        async def app(scope: Any, receive: Any, send: Any) -> None:
            await asyncio.sleep(0.8)  # other work past the deadline is not interrupted
            seen.append("worked")
            await receive()

        return app

    assert await _deadline_run(busy_then_read, [(0.0, last)]) == ["worked", "408"]
