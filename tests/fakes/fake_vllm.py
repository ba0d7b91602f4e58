"""FakeVllm: a fake vLLM-compatible server for fault injection, on loopback.

It speaks just enough of vLLM's OpenAI API (``/health``, ``/metrics``, ``/v1/models``,
``/openapi.json``, chat, completions and responses (plain and streamed), ``/tokenize`` and
``/detokenize``, and with ``pooling=True`` embeddings, score and rerank) to exercise the
gateway, and can be told to fail in the ways real servers do: an error status, a hang, a
stream cut mid-way, a stream that stalls or ends without ``[DONE]``. It records what it
saw, including cancellations.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from aiohttp import web

from tests.fakes.behaviour import MODEL, FakeBehaviour, FakeRecord
from tiergate.measure.wait import wait_until


class FakeVllm:
    """A fake vLLM server running on its own event loop in a background thread."""

    def __init__(self, model: str = MODEL, *, pooling: bool = False) -> None:
        self.model = model
        # Like a vLLM engine started for a pooling task: it serves embeddings, scores and
        # reranking, and none of the generate routes (vLLM registers routes by task).
        self.pooling = pooling
        self.behaviour = FakeBehaviour()
        self.record = FakeRecord()
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._slots: asyncio.Semaphore | None = None
        self._paths: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeVllm:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def wait_for(self, predicate: Any, timeout: float = 5.0) -> bool:
        return bool(wait_until(predicate, timeout, 0.02))

    @web.middleware
    async def _cookie(self, request: web.Request, handler: Any) -> web.StreamResponse:
        response: web.StreamResponse = await handler(request)
        if self.behaviour.set_cookie is not None and not response.prepared:
            response.headers["set-cookie"] = self.behaviour.set_cookie
        return response

    async def _start(self) -> None:
        app = web.Application(middlewares=[_fastapi_not_found, self._cookie])
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/openapi.json", self._openapi)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/detokenize", self._detokenize)
        if self.pooling:
            app.router.add_post("/v1/embeddings", self._embeddings)
            for path in POOLING_SCORE_PATHS:
                app.router.add_post(path, self._rerank if "rerank" in path else self._score)
        else:
            app.router.add_post("/v1/chat/completions", self._complete)
            app.router.add_post("/v1/completions", self._complete)
            app.router.add_post("/v1/responses", self._complete)
        self._paths = sorted(
            {r.resource.canonical for r in app.router.routes() if r.resource is not None}
        )
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    def _probe(self, request: web.Request) -> None:
        self.record.probes.append((request.path, request.headers.get("authorization")))

    def _refused(self, request: web.Request) -> web.Response | None:
        key = self.behaviour.api_key
        if key is None or request.headers.get("authorization") == f"Bearer {key}":
            return None
        return web.json_response({"error": "Unauthorized"}, status=401)

    async def _health(self, request: web.Request) -> web.Response:
        self._probe(request)
        return web.Response(status=200 if self.behaviour.healthy else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        self._probe(request)
        b = self.behaviour
        text = (
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="{self.model}"}} {b.running}\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{model_name="{self.model}"}} {b.waiting}\n'
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f'vllm:kv_cache_usage_perc{{model_name="{self.model}"}} 0.0\n'
            # Counted at arrival (vLLM counts at the end): what the tuner's quiet windows
            # read (tiergate.measure.quiet) adds running ones anyway.
            "# TYPE vllm:request_success_total counter\n"
            f'vllm:request_success_total{{finished_reason="stop",model_name="{self.model}"}} '
            f"{len(self.record.bodies)}\n"
        )
        return web.Response(text=text)

    async def _models(self, request: web.Request) -> web.Response:
        self._probe(request)
        refused = self._refused(request)
        if refused is not None:
            return refused
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.model,
                        "object": "model",
                        "created": 1,
                        "owned_by": "vllm",
                        "max_model_len": 2048,
                    }
                ],
            }
        )

    async def _openapi(self, request: web.Request) -> web.Response:
        self._probe(request)
        if not self.behaviour.describes_routes:
            return web.json_response({"detail": "Not Found"}, status=404)
        paths = {path: {"post": {}} for path in self._paths}
        return web.json_response({"openapi": "3.1.0", "info": {"title": "fake"}, "paths": paths})

    async def _accepted(self, request: web.Request) -> tuple[dict[str, Any], web.Response | None]:
        """Records a request to a route other than completions; its body, or a refusal."""
        refused = self._refused(request)
        if refused is not None:
            return {}, refused
        body = await request.json()
        self.record.requests += 1
        self.record.bodies.append(body)
        self.record.headers.append({k.lower(): v for k, v in request.headers.items()})
        if self.behaviour.mode == "status":
            return body, self._failure()
        return body, None

    def _failure(self) -> web.Response:
        status = self.behaviour.status
        error = {"message": f"fake failure {status}", "type": "FakeError", "param": None}
        return web.json_response({"error": {**error, "code": status}}, status=status)

    async def _tokenize(self, request: web.Request) -> web.Response:
        body, refused = await self._accepted(request)
        if refused is not None:
            return refused
        tokens = [ord(c) for c in "".join(_texts(body))]
        return web.json_response({"count": len(tokens), "max_model_len": 2048, "tokens": tokens})

    async def _detokenize(self, request: web.Request) -> web.Response:
        body, refused = await self._accepted(request)
        if refused is not None:
            return refused
        tokens = body.get("tokens") or []
        return web.json_response({"prompt": "".join(_token_text(int(t)) for t in tokens)})

    async def _embeddings(self, request: web.Request) -> web.Response:
        body, refused = await self._accepted(request)
        if refused is not None:
            return refused
        texts = _texts(body) or [""]
        data = [
            {"object": "embedding", "index": i, "embedding": [float(len(t)), 0.5, -0.5]}
            for i, t in enumerate(texts)
        ]
        tokens = sum(len(t) for t in texts)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return web.json_response(
            {"object": "list", "model": self.model, "data": data, "usage": usage}
        )

    async def _score(self, request: web.Request) -> web.Response:
        _body, refused = await self._accepted(request)
        if refused is not None:
            return refused
        usage = {"prompt_tokens": 4, "total_tokens": 4}
        return web.json_response(
            {"id": "score-1", "object": "list", "model": self.model, "data": [], "usage": usage}
        )

    async def _rerank(self, request: web.Request) -> web.Response:
        body, refused = await self._accepted(request)
        if refused is not None:
            return refused
        documents = body.get("documents") if isinstance(body.get("documents"), list) else []
        results = [
            {"index": i, "document": {"text": str(d)}, "relevance_score": 1.0 / (i + 1)}
            for i, d in enumerate(documents)
        ]
        return web.json_response(
            {
                "id": "rerank-1",
                "model": self.model,
                "usage": {"prompt_tokens": 4, "total_tokens": 4},
                "results": results,
            }
        )

    def _chunk(self, i: int, chat: bool, text: str | None = None) -> dict[str, Any]:
        last = i == self.behaviour.chunks - 1 or text is not None
        choice: dict[str, Any] = {"index": 0, "finish_reason": "stop" if last else None}
        if text is None:
            text = "x" * self.behaviour.chunk_chars if self.behaviour.chunk_chars else f"tok{i} "
        if chat:
            choice["delta"] = {"content": text}
        else:
            choice["text"] = text
        return {
            "id": "fake-1",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": 1,
            "model": self.model,
            "choices": [choice],
        }

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        refused = self._refused(request)
        if refused is not None:
            return refused
        body = await request.json()
        self.record.requests += 1
        self.record.bodies.append(body)
        self.record.headers.append({k.lower(): v for k, v in request.headers.items()})
        b = self.behaviour
        chat = request.path.endswith("/chat/completions")
        if b.refuses_priority and body.get("priority", 0) != 0:
            message = f"Got priority {body['priority']} but Priority scheduling is not enabled."
            error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
            return web.json_response({"error": error}, status=400)
        if request.path == "/v1/responses" and b.mode not in ("status", "hang"):
            return await self._respond(request, body)
        self.record.in_flight += 1
        self.record.most_in_flight = max(self.record.most_in_flight, self.record.in_flight)
        try:
            if b.mode == "status":
                return web.json_response(
                    {
                        "error": {
                            "message": f"fake failure {b.status}",
                            "type": "FakeError",
                            "param": None,
                            "code": b.status,
                        }
                    },
                    status=b.status,
                )
            if b.mode == "hang":
                await asyncio.sleep(3600)
            if b.slots:
                if self._slots is None:
                    self._slots = asyncio.Semaphore(b.slots)
                waited = self._slots.locked()
                async with self._slots:
                    self.record.slot_waits.append((_prompt_chars(body), waited))
                    self.record.in_slots += 1
                    try:
                        await asyncio.sleep(b.delay_per_prompt_char * _prompt_chars(body))
                    finally:
                        self.record.in_slots -= 1
            if not body.get("stream"):
                await asyncio.sleep(b.chunk_delay)
                text = "hello from fake"
                if b.replies:
                    text = b.replies.pop(0) if len(b.replies) > 1 else b.replies[0]
                message = {"role": "assistant", "content": text}
                choice = {"index": 0, "finish_reason": "stop"}
                choice.update({"message": message} if chat else {"text": "hello from fake"})
                return web.json_response(
                    {
                        "id": "fake-1",
                        "object": "chat.completion" if chat else "text_completion",
                        "created": 1,
                        "model": self.model,
                        "choices": [choice],
                        "service_tier": None,
                        "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6},
                    }
                )
            return await self._stream(request, body, chat)
        except asyncio.CancelledError:
            self.record.cancelled += 1
            raise
        finally:
            self.record.in_flight -= 1

    async def _stream(
        self, request: web.Request, body: dict[str, Any], chat: bool
    ) -> web.StreamResponse:
        b = self.behaviour
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        # Scripted replies (for the gateway, which streams non-streamed requests from the
        # engine): the reply in one chunk, after the delay a non-streamed answer has.
        reply = None
        if b.replies:
            reply = b.replies.pop(0) if len(b.replies) > 1 else b.replies[0]
            await asyncio.sleep(b.chunk_delay)
        for i in range(1 if reply is not None else b.chunks):
            if i > 0 and (b.chunk_delay or b.load_delay):
                await asyncio.sleep(b.chunk_delay + b.load_delay * self.record.in_flight)
            if b.mode == "cut_stream" and i == 2:
                await asyncio.sleep(0.1)  # let the earlier chunks leave before the cut
                assert request.transport is not None
                request.transport.abort()
                return resp
            if b.mode == "stall_stream" and i == 2:
                await asyncio.sleep(3600)
            try:
                chunk = self._chunk(i, chat, reply)
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            except ConnectionResetError:
                self.record.cancelled += 1
                return resp
        if b.mode == "truncate_stream":
            return resp
        options = body.get("stream_options") or {}
        if options.get("include_usage"):
            await asyncio.sleep(b.usage_delay)
            usage = {
                "prompt_tokens": 3,
                "completion_tokens": b.chunks,
                "total_tokens": 3 + b.chunks,
            }
            final = {
                "id": "fake-1",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": self.model,
                "choices": [],
                "usage": usage,
            }
            await resp.write(b"data: " + json.dumps(final).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        if b.end_delay:
            await asyncio.sleep(b.end_delay)
        return resp

    def _response_object(self, text: str, status: str) -> dict[str, Any]:
        output = [
            {
                "id": "msg-1",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ]
        return {
            "id": "resp-1",
            "object": "response",
            "created_at": 1,
            "model": self.model,
            "status": status,
            "output": output if status == "completed" else [],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "service_tier": "auto",
            "usage": {
                "input_tokens": 3,
                "output_tokens": 3,
                "total_tokens": 6,
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            }
            if status == "completed"
            else None,
        }

    async def _respond(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        """The Responses API: one response object, or its event stream (no `[DONE]`)."""
        b = self.behaviour
        if not body.get("stream"):
            return web.json_response(self._response_object("hello from fake", "completed"))
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)

        sequence = 0

        async def event(kind: str, data: dict[str, Any]) -> None:
            nonlocal sequence
            sequence += 1
            payload = json.dumps({"type": kind, "sequence_number": sequence, **data}).encode()
            await resp.write(b"event: " + kind.encode() + b"\ndata: " + payload + b"\n\n")

        await event("response.created", {"response": self._response_object("", "in_progress")})
        for i in range(b.chunks):
            if i > 0 and (b.chunk_delay or b.load_delay):
                await asyncio.sleep(b.chunk_delay + b.load_delay * self.record.in_flight)
            if b.mode == "truncate_stream" and i == 2:
                return resp
            delta = {"delta": f"tok{i} ", "item_id": "msg-1", "output_index": 0}
            await event("response.output_text.delta", {**delta, "content_index": 0, "logprobs": []})
        text = "".join(f"tok{i} " for i in range(b.chunks))
        await event("response.completed", {"response": self._response_object(text, "completed")})
        return resp


@web.middleware
async def _fastapi_not_found(request: web.Request, handler: Any) -> web.StreamResponse:
    """An unknown route answers as vLLM's FastAPI app does: 404 ``{"detail": "Not Found"}``."""
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return web.json_response({"detail": "Not Found"}, status=404)


POOLING_SCORE_PATHS = (
    "/pooling",
    "/classify",
    "/score",
    "/v1/score",
    "/rerank",
    "/v1/rerank",
    "/v2/rerank",
)


def _texts(body: dict[str, Any]) -> list[str]:
    for name in ("input", "prompt"):
        value = body.get(name)
        if isinstance(value, str):
            return [value]
        if isinstance(value, list):
            return [v if isinstance(v, str) else json.dumps(v) for v in value]
    messages = body.get("messages")
    if isinstance(messages, list):
        return [str(m.get("content", "")) for m in messages if isinstance(m, dict)]
    return []


def _token_text(token: int) -> str:
    # The fake's tokenizer makes one token per character (its code point).
    return chr(token) if 0 <= token < 0x110000 else f"<{token}>"


def _prompt_chars(body: dict[str, Any]) -> int:
    messages = body.get("messages") or []
    return sum(len(str(m.get("content", ""))) for m in messages) + len(str(body.get("prompt", "")))
