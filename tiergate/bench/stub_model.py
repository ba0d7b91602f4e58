"""StubAgentModel: an OpenAI-compatible chat endpoint for the jobs benchmark that answers
every job with one shell command, then ``DONE``.

The command is the job's instruction (the conversation's first user message): the first
answer gives it in a ```bash block; once the conversation holds its output (anything
after the first assistant message) the answer is ``DONE``. It is not streamed and costs
nothing, so what the benchmark measures is the queue, the workers and the sandbox. Run as
``python -m tiergate.bench.stub_model PORT``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from tiergate.bench.served import model_server

MODEL = "bench-agent"


def reply_for(messages: Sequence[Mapping[str, Any]]) -> str:
    """The stub's answer to a conversation."""
    if any(m.get("role") == "assistant" for m in messages):
        return "DONE"
    command = next((m.get("content") for m in messages if m.get("role") == "user"), None)
    return f"```bash\n{command or 'true'}\n```"


def build_app() -> web.Application:
    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        content = reply_for(body.get("messages") or [])
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

    return model_server(MODEL, chat)


if __name__ == "__main__":
    web.run_app(build_app(), host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
