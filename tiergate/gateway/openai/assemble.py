"""A non-streamed chat or completions answer, assembled from the engine's stream.

A non-streamed answer has no first byte until it is complete, so a time-out on it measures
the answer's length, not the engine's liveness: a long generation would be cut, fall back
and be generated twice, on the tier the caller did not ask for. So the gateway asks the
engine for a stream (with usage), holds it to the stream's time-outs (first byte, gap
between chunks) and answers the client with the JSON vLLM would have sent: the field set
and order of vLLM's ``ChatCompletionResponse`` / ``CompletionResponse.model_dump()``.

Requests whose non-streamed answer carries what a stream does not (prompt logprobs, the
echoed prompt, token ids, beam search) or that vLLM would refuse as streams differently
(``stream_options`` without ``stream``) go to the engine as sent.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import orjson

from tiergate.gateway.errors import from_upstream
from tiergate.gateway.openai.upstreamhttp import UpstreamDisconnected, UpstreamResponse
from tiergate.settings import TimeoutSettings

# Request fields whose non-streamed answer differs from an assembled stream.
_NOT_ASSEMBLED = (
    "prompt_logprobs",
    "echo",
    "best_of",
    "use_beam_search",
    "return_token_ids",
    "return_prompt_text",
    "kv_transfer_params",
    "ec_transfer_params",
)


def assembles(body: dict[str, Any]) -> bool:
    """Whether a non-streamed request with this body can be served from a stream."""
    if body.get("stream_options") is not None:
        return False
    for name in _NOT_ASSEMBLED:  # noqa: SIM110 (a loop: no generator per request)
        if body.get(name):
            return False
    return True


class _Choice:
    __slots__ = ("finish_reason", "logprobs", "reasoning", "role", "stop_reason", "text", "tools")

    def __init__(self) -> None:
        self.role = "assistant"
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.tools: dict[int, dict[str, Any]] = {}
        self.logprobs: dict[str, list[Any]] | None = None
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None


class AnswerAssembler:
    """Folds a chat or completions stream's chunks into the non-streamed answer."""

    def __init__(self, chat: bool, forced_tools: bool = False) -> None:
        self._chat = chat
        # A required or named tool choice: vLLM's message content is then "" when empty.
        self._forced_tools = forced_tools
        self._head: dict[str, Any] | None = None
        self._fingerprint: str | None = None
        self._choices: dict[int, _Choice] = {}
        self.usage: dict[str, Any] | None = None
        self.done = False

    @property
    def started(self) -> bool:
        """Whether a chunk has come (vLLM sends its first once the first token is out)."""
        return self._head is not None

    def feed(self, chunk: dict[str, Any]) -> None:
        if self._head is None:
            self._head = chunk
        if chunk.get("system_fingerprint") is not None:
            self._fingerprint = chunk["system_fingerprint"]  # on the last chunk only
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        for part in chunk.get("choices") or ():
            if isinstance(part, dict):
                self._feed_choice(part)

    def _feed_choice(self, part: dict[str, Any]) -> None:
        index = part.get("index", 0)
        choice = self._choices.get(index)
        if choice is None:
            choice = self._choices[index] = _Choice()
        if part.get("finish_reason") is not None:
            choice.finish_reason = part["finish_reason"]
        if part.get("stop_reason") is not None:
            choice.stop_reason = part["stop_reason"]
        logprobs = part.get("logprobs")
        if isinstance(logprobs, dict):
            if choice.logprobs is None:
                choice.logprobs = {}
            for name, values in logprobs.items():
                if isinstance(values, list):
                    choice.logprobs.setdefault(name, []).extend(values)
        if not self._chat:
            text = part.get("text")
            if isinstance(text, str):
                choice.text.append(text)
            return
        delta = part.get("delta")
        if not isinstance(delta, dict):
            return
        if isinstance(delta.get("role"), str):
            choice.role = delta["role"]
        if isinstance(delta.get("content"), str):
            choice.text.append(delta["content"])
        reasoning = delta.get("reasoning", delta.get("reasoning_content"))
        if isinstance(reasoning, str):
            choice.reasoning.append(reasoning)
        for call in delta.get("tool_calls") or ():
            if isinstance(call, dict):
                _feed_tool_call(choice.tools, call)

    def answer(self) -> dict[str, Any]:
        """The answer as vLLM's non-streamed route would have sent it."""
        head = self._head or {}
        choices = [
            self._chat_choice(i, c) if self._chat else _completion_choice(i, c)
            for i, c in sorted(self._choices.items())
        ]
        out: dict[str, Any] = {
            "id": head.get("id"),
            "object": "chat.completion" if self._chat else "text_completion",
            "created": head.get("created"),
            "model": head.get("model"),
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": self._fingerprint,
            "usage": _usage(self.usage or {}),
        }
        if self._chat:
            out.update(prompt_logprobs=None, prompt_token_ids=None, prompt_text=None)
        out.update(kv_transfer_params=None, ec_transfer_params=None, metrics=None)
        return out

    def _chat_choice(self, index: int, choice: _Choice) -> dict[str, Any]:
        text = "".join(choice.text)
        tools = [choice.tools[i] for i in sorted(choice.tools)]
        message: dict[str, Any] = {
            "role": choice.role,
            "content": text if text or not tools or self._forced_tools else None,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
        }
        if tools:
            message["tool_calls"] = tools
        message["reasoning"] = "".join(choice.reasoning) if choice.reasoning else None
        return {
            "index": index,
            "message": message,
            "logprobs": choice.logprobs,
            "finish_reason": choice.finish_reason,
            "stop_reason": choice.stop_reason,
            "token_ids": None,
            "routed_experts": None,
        }


def _feed_tool_call(tools: dict[int, dict[str, Any]], call: dict[str, Any]) -> None:
    index = call.get("index", len(tools))
    tool = tools.get(index)
    if tool is None:
        tool = tools[index] = {
            "id": call.get("id"),
            "type": call.get("type") or "function",
            "function": {"name": None, "arguments": ""},
        }
    if call.get("id") and not tool["id"]:
        tool["id"] = call["id"]
    function = call.get("function")
    if isinstance(function, dict):
        if function.get("name"):
            tool["function"]["name"] = function["name"]
        if isinstance(function.get("arguments"), str):
            tool["function"]["arguments"] += function["arguments"]


def _completion_choice(index: int, choice: _Choice) -> dict[str, Any]:
    return {
        "index": index,
        "text": "".join(choice.text),
        "logprobs": choice.logprobs,
        "finish_reason": choice.finish_reason,
        "stop_reason": choice.stop_reason,
        "token_ids": None,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "routed_experts": None,
    }


def _usage(usage: dict[str, Any]) -> dict[str, Any]:
    # vLLM's UsageInfo field order, whatever order the stream's usage chunk had.
    return {
        "prompt_tokens": usage.get("prompt_tokens", 0),
        "total_tokens": usage.get("total_tokens", 0),
        "completion_tokens": usage.get("completion_tokens", 0),
        "prompt_tokens_details": usage.get("prompt_tokens_details"),
        "completion_tokens_details": usage.get("completion_tokens_details"),
        **{k: v for k, v in usage.items() if k not in _USAGE_FIELDS},
    }


_USAGE_FIELDS = frozenset(
    {
        "prompt_tokens",
        "total_tokens",
        "completion_tokens",
        "prompt_tokens_details",
        "completion_tokens_details",
    }
)


@dataclass(frozen=True, slots=True)
class Assembled:
    """An assembled answer, the gateway's own seconds spent assembling it, and when (by
    ``time.perf_counter``) the read with its first chunk (the first token) came and the
    read with its last (the same time when one read held it all)."""

    answer: dict[str, Any]
    spent: float
    first_token_at: float
    ended_at: float


async def read_assembled(
    reader: UpstreamResponse, timeouts: TimeoutSettings, body: dict[str, Any], chat: bool
) -> Assembled:
    """The assembled answer to the request ``body``. Raises
    :class:`TimeoutError` when the engine sends no first chunk (its first token) within
    ``first_byte_seconds`` or then stops sending for ``between_chunks_seconds``,
    :class:`UpstreamDisconnected` when the stream ends before ``[DONE]``, and the error
    (an :class:`~tiergate.gateway.errors.OpenAIError`) when the engine sends one."""
    choice = body.get("tool_choice")
    assembler = AnswerAssembler(chat, choice == "required" or isinstance(choice, dict))
    buffer = b""
    spent = 0.0
    first_token_at: float | None = None
    wait = timeouts.first_byte_seconds  # queueing and prefill come before the first token
    while not assembler.done:
        chunk = await reader.readany(wait)
        if not chunk:
            raise UpstreamDisconnected("the engine ended the stream before it was complete")
        started = time.perf_counter()
        buffer += chunk
        while (end := buffer.find(b"\n\n")) >= 0:
            _fold(assembler, buffer[:end])
            buffer = buffer[end + 2 :]
        if assembler.started:
            wait = timeouts.between_chunks_seconds
            if first_token_at is None:
                first_token_at = started
        spent += time.perf_counter() - started
    # The last read's arrival: the first's when one read held the whole answer (its
    # tokens' times then unknown).
    ended_at = started
    started = time.perf_counter()
    answer = assembler.answer()
    spent += time.perf_counter() - started
    return Assembled(answer, spent, first_token_at or ended_at, ended_at)


def _fold(assembler: AnswerAssembler, event: bytes) -> None:
    if not event.startswith(b"data:"):
        return
    payload = event[5:].strip()
    if payload == b"[DONE]":
        assembler.done = True
        return
    try:
        chunk = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return
    if not isinstance(chunk, dict):
        return
    error = chunk.get("error")
    if error is not None:
        # vLLM's in-stream error carries its HTTP status as the code: a refusal stays one.
        code = error.get("code") if isinstance(error, dict) else None
        status = code if isinstance(code, int) and 400 <= code < 500 else 502
        raise from_upstream(status, payload)
    assembler.feed(chunk)
