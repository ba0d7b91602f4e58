"""The agent loop: the model proposes shell commands, the sandbox runs them, the output goes
back, until the model says it is done, ``max_steps`` or the job's time runs out.

Two protocols: OpenAI tool calling (a ``shell`` tool) for models served with a tool-call
parser, and a plain-text protocol for small models (one command in a fenced block, or
``DONE``), which is the default.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx

from tiergate.protocol import CommandEntry, TrajectoryEntry
from tiergate.protocol.openaibatch import LIMIT_HEADER
from tiergate.protocol.prompts import SHELL_TOOL, TEXT_SYSTEM_PROMPT, TOOLS_SYSTEM_PROMPT
from tiergate.sandbox import Sandbox

_FENCE = re.compile(r"```(?:[a-zA-Z]*)\n(.*?)```", re.S)
_DOLLAR = re.compile(r"^\s*\$ (.+)$", re.M)
_DONE = re.compile(r"\bDONE\b")

log = logging.getLogger("tiergate.worker")


class ModelUnavailable(Exception):
    """The model endpoint could not answer now (worth retrying the job later)."""


class ModelRefused(Exception):
    """The model endpoint refused the request (retrying will not help)."""


def parse_text_reply(text: str) -> str | None:
    """The command in a reply, or ``None`` when there is none."""
    fenced = _FENCE.search(text)
    if fenced and fenced.group(1).strip():
        return fenced.group(1).strip()
    dollar = _DOLLAR.search(text)
    if dollar:
        return dollar.group(1).strip()
    return None


class WorkerKey:
    """The workers' key: a fixed one (``jobs.worker.api_key``), or the file
    ``jobs.worker.api_key_file`` names, read again whenever it changes (the kubelet replaces
    a mounted Secret's file when the Secret changes) so that a rotated key is used without
    a restart. A file that cannot be read, or is empty, leaves the last key read in use."""

    def __init__(self, key: str | None = None, path: str | None = None) -> None:
        self._key = key
        self._path = Path(path) if path else None
        self._seen: tuple[int, int, int] | None = None
        self._lock = threading.Lock()

    @property
    def from_file(self) -> bool:
        return self._path is not None

    def get(self, force: bool = False) -> str | None:
        """The key now; ``force`` reads the file even when it looks unchanged."""
        if self._path is None:
            return self._key
        with self._lock:
            try:
                stat = self._path.stat()
                seen = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
                if force or seen != self._seen:
                    key = self._path.read_text().strip()
                    if not key:
                        raise OSError("the file is empty")
                    if self._key is not None and key != self._key:
                        log.info("the workers' key changed in %s: using the new one", self._path)
                    self._key, self._seen = key, seen
            except OSError as exc:
                if self._key is None:
                    # The path stays in the worker's log: a job's error never names one.
                    log.error("the workers' key file %s cannot be read: %s", self._path, exc)
                    raise ModelUnavailable("the workers' key file cannot be read") from exc
                log.warning("the workers' key file %s: %s (the last key stays)", self._path, exc)
            return self._key


class ModelClient:
    """Chat completions through the gateway, with the job's model and tier."""

    def __init__(
        self,
        base_url: str,
        model: str,
        service_tier: str,
        api_key: str | WorkerKey | None,
        timeout: float = 120.0,
        on_behalf_of: str | None = None,
    ) -> None:
        self._key = api_key if isinstance(api_key, WorkerKey) else WorkerKey(api_key)
        self._on_behalf_of = on_behalf_of
        self._client = httpx.Client(
            base_url=base_url.rstrip("/"),
            timeout=httpx.Timeout(timeout, connect=5.0),
        )
        self._model = model
        self._tier = service_tier

    def _headers(self, api_key: str | None) -> dict[str, str]:
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        if api_key and self._on_behalf_of:
            # The job's owner's models, tiers and limits apply to the agent's calls.
            headers["x-tiergate-on-behalf-of"] = self._on_behalf_of
        return headers

    def _post(self, body: dict[str, Any], api_key: str | None) -> httpx.Response:
        try:
            return self._client.post(
                "/v1/chat/completions", json=body, headers=self._headers(api_key)
            )
        except httpx.TransportError as exc:
            raise ModelUnavailable(f"{type(exc).__name__}: {exc}") from exc

    def chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self._model,
            "messages": messages,
            "service_tier": self._tier,
            "max_tokens": 256,
            "temperature": 0,
        }
        if tools:
            body["tools"] = tools
        api_key = self._key.get()
        resp = self._post(body, api_key)
        if resp.status_code == 401 and self._key.from_file:
            # The key may have been rotated since the file was last read: once more with
            # what the file holds now, if that differs.
            fresh = self._key.get(force=True)
            if fresh != api_key:
                resp = self._post(body, fresh)
        if resp.status_code == 429 and resp.headers.get(LIMIT_HEADER) == "budget":
            # The owner's spend budget is spent until its period turns (hours): the job
            # ends saying so rather than holding a slot retrying.
            raise ModelRefused(f"HTTP 429: {resp.text[:300]}")
        if resp.status_code in (429, 500, 502, 503, 504):
            raise ModelUnavailable(f"HTTP {resp.status_code}: {resp.text[:300]}")
        if resp.status_code != 200:
            raise ModelRefused(f"HTTP {resp.status_code}: {resp.text[:300]}")
        try:
            data = resp.json()
            message = data["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise ModelRefused(
                f"the model endpoint's answer is not a chat completion: {resp.text[:200]!r}"
            ) from None
        if not isinstance(message, dict):
            raise ModelRefused("the model endpoint's answer has no message")
        result: dict[str, Any] = data
        return result

    def close(self) -> None:
        self._client.close()


StopReason = Literal["done", "max_steps", "timeout", "cancelled"]


@dataclass
class AgentRun:
    steps: int = 0
    stop: StopReason = "done"
    trajectory: list[TrajectoryEntry] = field(default_factory=list)


@dataclass
class AgentLoop:
    model: ModelClient
    sandbox: Sandbox
    instruction: str
    max_steps: int
    deadline: float
    protocol: Literal["text", "tools"] = "text"
    cancelled: Callable[[], bool] = lambda: False
    on_step: Callable[[CommandEntry], None] = lambda step: None

    def run(self) -> AgentRun:
        run = AgentRun()
        system = TEXT_SYSTEM_PROMPT if self.protocol == "text" else TOOLS_SYSTEM_PROMPT
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": system},
            {"role": "user", "content": self.instruction},
        ]
        tools = [SHELL_TOOL] if self.protocol == "tools" else None
        while True:
            if self.cancelled():
                run.stop = "cancelled"
                return run
            if run.steps >= self.max_steps:
                run.stop = "max_steps"
                return run
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                run.stop = "timeout"
                return run
            started = time.monotonic()
            reply = self.model.chat(messages, tools)
            message = reply["choices"][0]["message"]
            content = message.get("content") or ""
            run.trajectory.append(
                {
                    "type": "model",
                    "content": content,
                    "tool_calls": message.get("tool_calls"),
                    "seconds": round(time.monotonic() - started, 3),
                    "usage": reply.get("usage"),
                    "service_tier": reply.get("service_tier"),
                    "ts": time.time(),
                }
            )
            command, call_id = self._command(message)
            if command is None:
                if self.protocol == "tools" or _DONE.search(content):
                    run.stop = "done"
                    return run
                messages += [
                    {"role": "assistant", "content": content},
                    {
                        "role": "user",
                        "content": "No command found. Answer with one command in "
                        "a ```bash block, or DONE if the task is complete.",
                    },
                ]
                run.steps += 1
                continue
            run.steps += 1
            result = self.sandbox.run(command, timeout=max(1.0, remaining))
            entry: CommandEntry = {
                "type": "command",
                "step": run.steps,
                "command": command,
                "exit_code": result.exit_code,
                "output": result.output,
                "seconds": round(result.seconds, 3),
                "timed_out": result.timed_out,
                "ts": time.time(),
            }
            run.trajectory.append(entry)
            self.on_step(entry)
            feedback = f"exit status {result.exit_code}\n{result.output}"
            if call_id is not None:
                messages += [
                    {
                        "role": "assistant",
                        "content": content,
                        "tool_calls": message.get("tool_calls"),
                    },
                    {"role": "tool", "tool_call_id": call_id, "content": feedback},
                ]
            else:
                messages += [
                    {"role": "assistant", "content": content},
                    {"role": "user", "content": feedback},
                ]

    def _command(self, message: dict[str, Any]) -> tuple[str | None, str | None]:
        calls = message.get("tool_calls") or []
        if self.protocol == "tools" and calls:
            call = calls[0]
            try:
                args = json.loads(call["function"]["arguments"] or "{}")
            except (json.JSONDecodeError, KeyError, TypeError):
                args = {}
            command = args.get("command") if isinstance(args, dict) else None
            return (str(command) if command else None), call.get("id")
        return parse_text_reply(message.get("content") or ""), None
