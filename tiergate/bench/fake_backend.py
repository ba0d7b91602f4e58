"""ZeroCostFakeBackend: a fake vLLM-compatible streaming server for the gateway benchmark.

It streams ``chunks`` SSE events ``gap_ms`` apart and does nothing else, so that what the
benchmark sees through the gateway is the gateway's own cost. Each chunk carries the
moment it was written (``sent_at``, ``time.monotonic()``: one clock for every process on
the machine), so a client measures each chunk's transit through a proxy exactly, free of
the scheduling drift of the gaps themselves. Run as
``python -m tiergate.bench.fake_backend PORT CHUNKS GAP_MS``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from aiohttp import web

from tiergate.bench.served import model_server

MODEL = "bench-model"


def build_app(chunks: int, gap_ms: float) -> web.Application:
    head, tail = (
        json.dumps(
            {
                "id": "b",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": MODEL,
                "sent_at": 0.5,
                "choices": [{"index": 0, "delta": {"content": "tok "}, "finish_reason": None}],
            }
        )
        .encode()
        .split(b"0.5", 1)
    )
    usage = json.dumps(
        {
            "id": "b",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": MODEL,
            "choices": [],
            "usage": {"prompt_tokens": 1, "completion_tokens": chunks, "total_tokens": chunks + 1},
        }
    ).encode()

    async def stream(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(chunks):
            if i:
                await asyncio.sleep(gap_ms / 1000.0)
            sent_at = repr(time.monotonic()).encode()
            await resp.write(b"data: " + head + sent_at + tail + b"\n\n")
        await resp.write(b"data: " + usage + b"\n\ndata: [DONE]\n\n")
        return resp

    return model_server(MODEL, stream)


if __name__ == "__main__":
    port, chunks, gap = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    web.run_app(build_app(chunks, gap), host="127.0.0.1", port=port, access_log=None, print=None)
