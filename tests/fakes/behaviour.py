"""What the fake vLLM server (tests/fakes/fake_vllm.py) is told to do, and what it
records: the fault a test injects (:class:`FakeBehaviour`) and what the gateway sent it
(:class:`FakeRecord`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MODEL = "fake-model"


@dataclass
class FakeBehaviour:
    mode: str = "ok"  # ok | status | hang | cut_stream | truncate_stream | stall_stream
    status: int = 500
    chunks: int = 5
    chunk_delay: float = 0.0
    # An engine whose step grows with its batch: a stream's chunks come this much later
    # again for each completion request in flight (its own included).
    load_delay: float = 0.0
    healthy: bool = True
    running: float = 0.0
    waiting: float = 0.0
    # A latency model: an engine with `slots` sequences at once (0: unlimited) that spends
    # `delay_per_prompt_char` seconds per prompt character before answering.
    slots: int = 0
    delay_per_prompt_char: float = 0.0
    # Scripted assistant replies for non-streaming chat, in order; the last one repeats.
    replies: list[str] = field(default_factory=list)
    # Like vLLM's --api-key: /v1/* without this bearer token is answered 401.
    api_key: str | None = None
    # False: /openapi.json answers 404, so a gateway cannot learn which routes it serves.
    describes_routes: bool = True
    # A Set-Cookie header on every answer (as a sticky load balancer in front of vLLM sets).
    set_cookie: str | None = None
    # Streams: each chunk's text is this many characters (0: "tok{i} "), and the usage
    # chunk comes this long after the last content chunk.
    chunk_chars: int = 0
    usage_delay: float = 0.0
    # How long after `[DONE]` the response's body ends (vLLM ends it in a write of its own).
    end_delay: float = 0.0
    # Like an engine started with vLLM's default --scheduling-policy fcfs: a completion
    # asking for a nonzero `priority` is answered 400.
    refuses_priority: bool = False


@dataclass
class FakeRecord:
    requests: int = 0
    cancelled: int = 0
    # Completion requests being answered now, and the most there were at once.
    in_flight: int = 0
    most_in_flight: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    # The headers of each completion request, in the order of ``bodies``.
    headers: list[dict[str, str]] = field(default_factory=list)
    # (path, authorization header or None) of each /health, /metrics and /v1/models probe.
    probes: list[tuple[str, str | None]] = field(default_factory=list)
    # With behaviour.slots: requests holding a slot now, and for each request that got one,
    # (its prompt's characters, whether it found every slot taken and had to wait).
    in_slots: int = 0
    slot_waits: list[tuple[int, bool]] = field(default_factory=list)
