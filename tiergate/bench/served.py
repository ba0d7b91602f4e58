"""What the benchmarks' stand-in model servers share: the routes a gateway's pool reads of
an OpenAI-compatible server (``/health``, ``/metrics``, ``/v1/models``) around the one
answer each benchmark needs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def model_server(model: str, chat: Handler) -> web.Application:
    """An app that serves ``model`` and answers ``POST /v1/chat/completions`` with ``chat``."""
    models = {"object": "list", "data": [{"id": model, "object": "model", "created": 1}]}

    async def health(request: web.Request) -> web.Response:
        return web.Response()

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text="")

    async def list_models(request: web.Request) -> web.Response:
        return web.json_response(models)

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/v1/chat/completions", chat)
    return app
