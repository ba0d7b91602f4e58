"""StubAgentModel: an OpenAI-compatible chat endpoint for the jobs benchmark that answers
every job with one shell command, then ``DONE``.

The command is the job's instruction (the conversation's first user message): the first
answer gives it in a ```bash block; once the conversation holds its output (anything
after the first assistant message) the answer is ``DONE``. It costs nothing, so what the
benchmark measures is the queue, the workers and the sandbox. Asked to stream (the soak's
interactive calls), it sends the answer a word at a time, ``STREAM_GAP`` apart, and its
usage last; ``POST /v1/responses`` answers the same way in the Responses API's shapes.
Run as ``python -m tiergate.bench.stub_model PORT``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from tiergate.bench.served import model_server

MODEL = "bench-agent"
STREAM_GAP = 0.005  # seconds between two streamed words


def reply_for(messages: Sequence[Mapping[str, Any]]) -> str:
    """The stub's answer to a conversation."""
    if any(m.get("role") == "assistant" for m in messages):
        return "DONE"
    command = next((m.get("content") for m in messages if m.get("role") == "user"), None)
    return f"```bash\n{command or 'true'}\n```"


def build_app() -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        content = reply_for(body.get("messages") or [])
        if body.get("stream"):
            return await _stream(request, content)
        return web.json_response(
            {
                "id": "chatcmpl-stub",
                "object": "chat.completion",
                "created": 1,
                "model": MODEL,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    async def responses(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        text = body.get("input")
        messages = [{"role": "user", "content": text if isinstance(text, str) else "true"}]
        content = reply_for(messages)
        if body.get("stream"):
            return await _stream_response(request, content)
        return web.json_response(_response_object(content, "completed"))

    app = model_server(MODEL, chat)
    app.router.add_post("/v1/responses", responses)
    return app


def _response_object(content: str, status: str) -> dict[str, Any]:
    words = len(content.split(" "))
    text = {"type": "output_text", "text": content, "annotations": []}
    message = {"type": "message", "id": "msg_stub", "role": "assistant", "status": status}
    return {
        "id": "resp_stub",
        "object": "response",
        "created_at": 1,
        "model": MODEL,
        "status": status,
        "output": [{**message, "content": [text]}] if status == "completed" else [],
        "usage": {"input_tokens": 1, "output_tokens": words, "total_tokens": 1 + words},
    }


async def _stream_response(request: web.Request, content: str) -> web.StreamResponse:
    """The Responses API's typed events: created, a delta per word, completed."""
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    seq = 0

    async def send(kind: str, **data: Any) -> None:
        nonlocal seq
        seq += 1
        event = {"type": kind, "sequence_number": seq, **data}
        await resp.write(f"event: {kind}\ndata: {json.dumps(event)}\n\n".encode())

    await send("response.created", response=_response_object("", "in_progress"))
    for i, word in enumerate(content.split(" ")):
        await asyncio.sleep(STREAM_GAP)
        delta = word if i == 0 else " " + word
        await send("response.output_text.delta", item_id="msg_stub", output_index=0, delta=delta)
    await send("response.completed", response=_response_object(content, "completed"))
    await resp.write_eof()
    return resp


def _chunk(delta: dict[str, Any], finish: str | None, usage: Any = None) -> bytes:
    chunk = {
        "id": "chatcmpl-stub",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": MODEL,
        "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}],
        **({"usage": usage} if usage else {}),
    }
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


async def _stream(request: web.Request, content: str) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    words = content.split(" ")
    await resp.write(_chunk({"role": "assistant", "content": ""}, None))
    for i, word in enumerate(words):
        await asyncio.sleep(STREAM_GAP)
        await resp.write(_chunk({"content": word if i == 0 else " " + word}, None))
    await resp.write(_chunk({}, "stop"))
    usage = {"prompt_tokens": 1, "completion_tokens": len(words), "total_tokens": 1 + len(words)}
    await resp.write(_chunk({}, None, usage))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


if __name__ == "__main__":
    web.run_app(build_app(), host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
