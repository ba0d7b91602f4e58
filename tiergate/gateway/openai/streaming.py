"""Relaying vLLM's Server-Sent Events to the client, chunk by chunk.

After the first byte has gone out the tier can no longer change: an upstream that breaks,
stalls or ends without ``[DONE]`` becomes one error event in OpenAI's envelope, and is
counted. A client that goes away cancels the relay, which closes the upstream connection,
which makes vLLM abort the request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from tiergate.gateway.errors import from_upstream, sse_error_event
from tiergate.gateway.openai.relay import RelayResponse
from tiergate.gateway.openai.routes import echo_tier
from tiergate.gateway.openai.upstream import Opened
from tiergate.tiers import Tier

_DONE = b"data: [DONE]\n\n"


@dataclass(slots=True)
class StreamOutcome:
    """What a finished relay observed, for metrics and the log line."""

    first_token_at: float | None = None
    usage: dict[str, Any] | None = None
    error: str | None = None
    completed: bool = False
    cancelled: bool = False
    processing_seconds: float = 0.0
    # Characters of generated text relayed: what a stream that ends without usage is
    # charged for (a client that leaves before the usage chunk must not dodge its tokens).
    relayed_chars: int = 0
    # Seconds the relay's writes waited for the client to read: a stream's time that is
    # the client's doing, not the engine's (tiergate.gateway.openai.relay).
    client_wait_seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


class EventRewriter(Protocol):
    def __call__(self, event: bytes) -> bytes | None: ...

    def error_event(self, message: str, code: str) -> bytes: ...


class ChunkRewriter:
    """Chat and completions: rewrites one ``data:`` event: echoes the served tier, hides
    usage the client did not ask for (the gateway always asks, to count tokens)."""

    def __init__(
        self, served_tier: Tier, wants_usage: bool, outcome: StreamOutcome, flex: bool = False
    ) -> None:
        self._tier = served_tier
        self._flex = flex
        self._wants_usage = wants_usage
        self._outcome = outcome

    def error_event(self, message: str, code: str) -> bytes:
        return sse_error_event(message, code)

    def __call__(self, event: bytes) -> bytes | None:
        if not event.startswith(b"data:"):
            return event + b"\n\n" if event.strip() else None
        payload = event[5:].strip()
        if payload == b"[DONE]":
            self._outcome.completed = True
            return _DONE
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return event + b"\n\n"
        if not isinstance(obj, dict):
            return event + b"\n\n"
        if "error" in obj:
            err = from_upstream(502, payload)
            self._outcome.error = "upstream_error_event"
            return b"data: " + orjson.dumps(err.envelope()) + b"\n\n"
        usage = obj.get("usage")
        if usage:
            self._outcome.usage = usage
        choices = obj.get("choices")
        if choices:
            if self._outcome.first_token_at is None:
                self._outcome.first_token_at = time.perf_counter()
            self._outcome.relayed_chars += _generated_chars(choices)
        if not self._wants_usage:
            if not choices and usage:
                return None
            obj.pop("usage", None)
        echo_tier(obj, self._tier, self._flex)
        return b"data: " + orjson.dumps(obj) + b"\n\n"


def _generated_chars(choices: Any) -> int:
    """The generated text's characters in one chunk's choices (content, text, reasoning
    and tool-call arguments: what the engine spent tokens on)."""
    count = 0
    for choice in choices if isinstance(choices, list) else ():
        if not isinstance(choice, dict):
            continue
        text = choice.get("text")
        if isinstance(text, str):
            count += len(text)
        delta = choice.get("delta")
        if isinstance(delta, dict):
            for name in ("content", "reasoning_content", "reasoning"):
                part = delta.get(name)
                if isinstance(part, str):
                    count += len(part)
            for call in delta.get("tool_calls") or ():
                function = call.get("function") if isinstance(call, dict) else None
                arguments = function.get("arguments") if isinstance(function, dict) else None
                if isinstance(arguments, str):
                    count += len(arguments)
    return count


_TERMINAL_RESPONSE_EVENTS = frozenset(
    {"response.completed", "response.failed", "response.incomplete"}
)


class ResponseEventRewriter:
    """The Responses API's typed events (``event:`` and ``data:`` lines, no ``[DONE]``): the
    served tier goes into each event's ``response`` object; the stream is complete at its
    terminal event, whose ``response.usage`` is the stream's usage."""

    def __init__(self, served_tier: Tier, outcome: StreamOutcome, flex: bool = False) -> None:
        self._tier = served_tier
        self._flex = flex
        self._outcome = outcome
        self._sequence = 0

    def error_event(self, message: str, code: str) -> bytes:
        """The Responses API's own error event (its clients read events by ``type``)."""
        error: dict[str, Any] = {"type": "error", "code": code, "message": message}
        error.update(param=None, sequence_number=self._sequence + 1)
        return b"event: error\ndata: " + orjson.dumps(error) + b"\n\n"

    def __call__(self, event: bytes) -> bytes | None:
        if not event.strip():
            return None
        lines = event.split(b"\n")
        at = next((i for i, line in enumerate(lines) if line.startswith(b"data:")), None)
        if at is None:
            return event + b"\n\n"
        try:
            obj = orjson.loads(lines[at][5:].strip())
        except orjson.JSONDecodeError:
            return event + b"\n\n"
        if not isinstance(obj, dict):
            return event + b"\n\n"
        kind = obj.get("type")
        if isinstance(obj.get("sequence_number"), int):
            self._sequence = obj["sequence_number"]
        if kind == "error":
            self._outcome.error = "upstream_error_event"
        if kind == "response.output_text.delta":
            if self._outcome.first_token_at is None:
                self._outcome.first_token_at = time.perf_counter()
            delta = obj.get("delta")
            self._outcome.relayed_chars += len(delta) if isinstance(delta, str) else 0
        response = obj.get("response")
        if not isinstance(response, dict):
            return event + b"\n\n"
        echo_tier(response, self._tier, self._flex)
        if kind in _TERMINAL_RESPONSE_EVENTS:
            self._outcome.completed = True
            usage = response.get("usage")
            if isinstance(usage, dict):
                self._outcome.usage = usage
        lines[at] = b"data: " + orjson.dumps(obj)
        return b"\n".join(lines) + b"\n\n"


async def relay_events(
    opened: Opened,
    rewrite: EventRewriter,
    between_chunks_seconds: float,
    outcome: StreamOutcome,
    on_finish: Callable[[StreamOutcome], None],
) -> AsyncIterator[bytes]:
    """Yield the client's bytes as upstream bytes arrive; always end the stream properly."""
    buffer = b""
    reader = opened.response
    try:
        while True:
            try:
                # The wait's own timer, not asyncio.timeout around it: one per chunk.
                chunk = await reader.readany(between_chunks_seconds)
            except TimeoutError:
                outcome.error = "upstream_stalled"
                opened.endpoint.record_failure()
                yield rewrite.error_event(
                    f"The upstream sent nothing for {between_chunks_seconds:g}s; "
                    "the stream was ended.",
                    "upstream_timeout",
                )
                return
            if not chunk:
                break
            started = time.perf_counter()
            buffer += chunk
            parts: list[bytes] = []
            while (end := buffer.find(b"\n\n")) >= 0:
                out = rewrite(buffer[:end])
                buffer = buffer[end + 2 :]
                if out is not None:
                    parts.append(out)
            outcome.processing_seconds += time.perf_counter() - started
            if parts:
                yield b"".join(parts)
        if not outcome.completed and outcome.error is None:
            outcome.error = "upstream_truncated"
            yield rewrite.error_event(
                "The upstream ended the stream before it was complete.", "upstream_stream_broken"
            )
    except OSError as exc:
        outcome.error = "upstream_broken"
        opened.endpoint.record_failure()
        yield rewrite.error_event(
            f"The upstream connection broke mid-stream ({type(exc).__name__}).",
            "upstream_stream_broken",
        )
    except asyncio.CancelledError:
        # A client that hangs up once it has the stream's end (the openai SDK closes at
        # `[DONE]`, before the engine's body has ended) got the whole answer.
        if not outcome.completed:
            outcome.cancelled = True
        raise
    finally:
        on_finish(outcome)


class EventStreamResponse(RelayResponse):
    """A relayed event stream; the time its writes waited for the client goes into its
    outcome."""

    media_type = "text/event-stream"

    def __init__(
        self,
        content: AsyncIterator[bytes],
        cleanup: Callable[[str | None], None],
        write_seconds: float,
        outcome: StreamOutcome,
        **kwargs: Any,
    ) -> None:
        super().__init__(content, cleanup, write_seconds, **kwargs)
        self._outcome = outcome

    def waited(self, seconds: float) -> None:
        self._outcome.client_wait_seconds += seconds
