"""The soak's load: every surface at once, at stated rates, each call recorded in the
:class:`History` with what it was told and when.

Drivers (threads, each at its own rate, the tenants taking turns):
- ``chat``: chat completions (and one call in three the Responses API) on ``default``
  (standard), ``priority`` (fast) and ``flex``, streamed and not, some with a tool offered;
- ``jobs``: agent jobs, one in ``hostile_every`` hostile (a fork bomb, a disk filler,
  endless output), each followed to its end afterwards;
- ``batches``: an OpenAI batch (a JSONL upload, then ``POST /v1/batches``), its output and
  error files read at the end;
- ``streams``: a job's event stream read two events at a time, the connection dropped
  and resumed from the last ``sequence_number``.

All go through the Service (nginx in front of the two replicas), as a client in the
cluster would.
"""

from __future__ import annotations

import itertools
import json
import random
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from tiergate.bench.soak.stack import TENANTS
from tiergate.bench.stub_model import MODEL
from tiergate.jobsclient.errors import JobsError
from tiergate.jobsclient.sync import JobsClient

TIERS = (("default", "standard"), ("priority", "fast"), ("flex", "standard"))
HOSTILE = {
    "fork-bomb": "f() { f | f & }; f",
    "disk-filler": "dd if=/dev/zero of=fill bs=1M count=100000",
    "endless-output": "yes tiergate-soak",
}


@dataclass(frozen=True)
class Rates:
    """Calls per second of each driver (0: off)."""

    chat_per_s: float = 4.0
    jobs_per_s: float = 0.2
    batches_per_s: float = 1 / 60
    batch_lines: int = 20
    streams_per_s: float = 0.05
    rollout_batches_per_s: float = 1 / 600
    hostile_every: int = 5
    chat_timeout_s: float = 60.0
    model: str = MODEL

    def named(self) -> dict[str, float]:
        return {
            "chat_per_s": self.chat_per_s,
            "jobs_per_min": round(self.jobs_per_s * 60, 2),
            "batches_per_min": round(self.batches_per_s * 60, 2),
            "batch_lines": self.batch_lines,
            "event_streams_per_min": round(self.streams_per_s * 60, 2),
            "rollout_batches_per_hour": round(self.rollout_batches_per_s * 3600, 2),
        }


@dataclass
class History:
    """Every call of the run (``records``), appended from the drivers' threads."""

    start: float = field(default_factory=time.time)
    records: list[dict[str, Any]] = field(default_factory=list)
    # Each tenant's marker, drawn per run: in its prompts, and never in the other's
    # answers (unguessable, so a real model cannot say it by chance: "team-a" it did).
    markers: dict[str, str] = field(
        default_factory=lambda: {t: f"m{secrets.token_hex(5)}" for t in TENANTS}
    )
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, **record: Any) -> None:
        with self.lock:
            self.records.append(record)

    def of(self, kind: str) -> list[dict[str, Any]]:
        with self.lock:
            return [r for r in self.records if r["kind"] == kind]


def _error_type(resp: httpx.Response) -> str | None:
    """The OpenAI envelope's ``error.type`` (or ``code``), None when the body is not one."""
    try:
        body = resp.json()
    except ValueError:
        return None
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        return None
    return str(err.get("type") or err.get("code") or "") or None


def _chat_body(
    model: str, service_tier: str, stream: bool, tools: bool, marker: str
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": f"say {marker} back"}],
        "max_tokens": 16,
        "service_tier": service_tier,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": "lookup",
                    "description": "Look a word up",
                    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
                },
            }
        ]
    return body


def chat_once(
    client: httpx.Client, history: History, tenant: str, key: str, n: int, rates: Rates
) -> None:
    """One interactive call: chat completions, or one in three the Responses API."""
    timeout = rates.chat_timeout_s
    service_tier, tier = TIERS[n % len(TIERS)]
    stream = n % 2 == 0
    marker = f"{history.markers[tenant]}-{n}"
    api = "responses" if (n // 2) % 3 == 2 else "chat"
    if api == "responses":
        path = "/v1/responses"
        body: dict[str, Any] = {"model": rates.model, "input": f"say {marker} back"}
        body.update(max_output_tokens=16, service_tier=service_tier, stream=stream)
    else:
        path = "/v1/chat/completions"
        body = _chat_body(rates.model, service_tier, stream, n % 7 == 0, marker)
    headers = {"authorization": f"Bearer {key}"}
    t0 = time.time()
    rec: dict[str, Any] = {"kind": "chat", "tenant": tenant, "tier": tier, "stream": stream}
    rec.update(service_tier=service_tier, t0=t0 - history.start, marker=marker, api=api)
    try:
        if stream:
            outcome, status, etype, text = _stream_chat(client, path, body, headers, timeout)
        else:
            resp = client.post(path, json=body, headers=headers, timeout=timeout)
            status, etype = resp.status_code, _error_type(resp)
            text = resp.text if status == 200 else ""
            outcome = "answered" if status == 200 else ("refused" if etype else "untyped")
    except httpx.TimeoutException:
        outcome, status, etype, text = "hung", None, None, ""
    except httpx.HTTPError as exc:
        outcome, status, etype, text = "cut", None, type(exc).__name__, ""
    rec.update(outcome=outcome, status=status, error=etype, t1=time.time() - history.start)
    for other, mark in history.markers.items():
        at = text.find(mark) if other != tenant else -1
        if at >= 0:
            rec["foreign"] = text[max(0, at - 40) : at + 60]
    history.add(**rec)


def _stream_chat(
    client: httpx.Client, path: str, body: dict[str, Any], headers: dict[str, str], timeout: float
) -> tuple[str, int, str | None, str]:
    """A chat answer ends with ``[DONE]``, a response with its terminal event; an error
    event in the stream is a typed refusal."""
    deadline = time.monotonic() + timeout
    with client.stream("POST", path, json=body, headers=headers, timeout=timeout) as resp:
        if resp.status_code != 200:
            resp.read()
            etype = _error_type(resp)
            return ("refused" if etype else "untyped"), resp.status_code, etype, ""
        parts: list[str] = []
        for line in resp.iter_lines():
            if time.monotonic() > deadline:
                return "hung", 200, None, ""
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                return "answered", 200, None, "".join(parts)
            event = json.loads(data)
            if "error" in event:
                err = event["error"] or {}
                return "refused", 200, str(err.get("type") or err.get("code") or "error"), ""
            kind = event.get("type")
            if kind == "error":
                return "refused", 200, str(event.get("code") or "error"), ""
            if kind in ("response.failed", "response.incomplete"):
                return "refused", 200, kind, ""
            if kind == "response.completed":
                return "answered", 200, None, "".join(parts)
            if kind == "response.output_text.delta":
                parts.append(str(event.get("delta") or ""))
            for choice in event.get("choices") or []:
                parts.append((choice.get("delta") or {}).get("content") or "")
        return "cut", 200, "stream ended without [DONE]", ""


def job_body(model: str, tenant: str, n: int, hostile: str | None) -> dict[str, Any]:
    """The stand-in engine gives the instruction back as the job's one command (a real
    model takes it as its task: a hostile job is then only as hostile as the model)."""
    command = HOSTILE[hostile] if hostile else f"echo {tenant}-{n} > done"
    return {
        "model": model,
        "instruction": command,
        "limits": {"max_steps": 2, "timeout_seconds": 60, "disk_mb": 256, "memory_mb": 512},
        "verifier": {"command": "test -f done", "timeout_seconds": 10},
        "metadata": {"tenant": tenant, "n": str(n), "hostile": hostile or ""},
    }


def submit_job(
    client: httpx.Client, history: History, tenant: str, key: str, n: int, rates: Rates
) -> None:
    every = rates.hostile_every
    hostile = (
        list(HOSTILE)[(n // every) % len(HOSTILE)] if every and n % every == every - 1 else None
    )
    headers = {"authorization": f"Bearer {key}", "idempotency-key": f"soak-{tenant}-{n}"}
    t0 = time.time() - history.start
    status, job_id, etype = _post_retrying(
        client, "/v1/jobs", json.dumps(job_body(rates.model, tenant, n, hostile)).encode(), headers
    )
    history.add(
        kind="job",
        tenant=tenant,
        n=n,
        hostile=hostile,
        t0=t0,
        status=status,
        id=job_id,
        error=etype,
    )


def _post_retrying(
    client: httpx.Client, path: str, content: bytes, headers: dict[str, str], tries: int = 6
) -> tuple[int | None, str | None, str | None]:
    """A POST retried as a client retries (idempotency key: the same job); the last
    answer's status, id and error type."""
    status: int | None = None
    etype: str | None = None
    for attempt in range(tries):
        try:
            resp = client.post(
                path, content=content, headers={**headers, "content-type": "application/json"}
            )
        except httpx.HTTPError as exc:
            status, etype = None, type(exc).__name__
        else:
            status, etype = resp.status_code, _error_type(resp)
            if status == 200 or status == 201:
                return status, str(resp.json()["id"]), None
            if status not in (429, 500, 502, 503, 504):
                return status, None, etype
        time.sleep(min(8.0, 0.5 * 2**attempt))
    return status, None, etype


def submit_batch(
    client: httpx.Client, history: History, tenant: str, key: str, n: int, rates: Rates
) -> None:
    lines = rates.batch_lines
    headers = {"authorization": f"Bearer {key}"}
    ids = [f"{tenant}-b{n}-{i}" for i in range(lines)]
    jsonl = "".join(
        json.dumps(
            {
                "custom_id": cid,
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": rates.model,
                    "max_tokens": 8,
                    "messages": [{"role": "user", "content": cid}],
                },
            }
        )
        + "\n"
        for cid in ids
    )
    t0 = time.time() - history.start
    rec: dict[str, Any] = {"kind": "batch", "tenant": tenant, "n": n, "t0": t0, "custom_ids": ids}
    try:
        up = client.post(
            "/v1/files",
            headers=headers,
            files={"file": (f"soak-{n}.jsonl", jsonl.encode(), "application/jsonl")},
            data={"purpose": "batch"},
        )
        if up.status_code != 200:
            history.add(
                **rec, status=up.status_code, error=_error_type(up), id=None, stage="upload"
            )
            return
        create = {
            "input_file_id": up.json()["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        }
        status, batch_id, etype = _post_retrying(
            client, "/v1/batches", json.dumps(create).encode(), headers, tries=3
        )
        history.add(**rec, status=status, error=etype, id=batch_id, stage="create")
    except httpx.HTTPError as exc:
        history.add(**rec, status=None, error=type(exc).__name__, id=None, stage="upload")


def follow_events(
    client: httpx.Client, history: History, tenant: str, key: str, job_id: str, deadline: float
) -> None:
    """Read a job's events two at a time, dropping the connection after each pair and
    resuming after the last ``sequence_number`` read; record every number seen."""
    headers = {"authorization": f"Bearer {key}", "accept": "text/event-stream"}
    seen: list[int] = []
    done = False
    reconnects = 0
    error: str | None = None
    while not done and time.time() < deadline:
        after = seen[-1] if seen else 0
        try:
            with client.stream(
                "GET",
                f"/v1/jobs/{job_id}/events",
                params={"starting_after": after},
                headers=headers,
                timeout=30,
            ) as resp:
                if resp.status_code != 200:
                    resp.read()
                    error = _error_type(resp) or str(resp.status_code)
                    time.sleep(1.0)
                    reconnects += 1
                    continue
                got = 0
                for line in resp.iter_lines():
                    if line == "data: [DONE]":
                        done = True
                        break
                    if line.startswith("data: "):
                        event = json.loads(line[6:])
                        if "error" in event:  # the store failed mid-stream: typed, resumed
                            error = str(event["error"].get("code") or event["error"].get("type"))
                            break
                        seen.append(int(event["sequence_number"]))
                        got += 1
                        if got == 2:
                            break
        except httpx.HTTPError as exc:
            error = type(exc).__name__
            time.sleep(0.5)
        reconnects += 1
    history.add(
        kind="events",
        tenant=tenant,
        id=job_id,
        seen=seen,
        done=done,
        reconnects=reconnects,
        error=error,
    )


# The verifier's coin: a sample passes half the time, so that tasks go on to a second round.
_COIN = "test $(( $(od -An -N1 -tu1 /dev/urandom) % 2 )) -eq 0 && touch done; true"


def rollout_batch(
    base_url: str, history: History, tenant: str, key: str, n: int, rates: Rates
) -> None:
    """A rollout batch (4 tasks, 2 samples, up to 2 rounds), its groups taken as a trainer
    takes them while it runs; every group's ``seq`` and (task, round) recorded."""
    tasks = [
        {
            "model": rates.model,
            "instruction": f"sleep 1 && {_COIN}",
            "limits": {"max_steps": 2, "timeout_seconds": 120},
            "verifier": {"command": "test -f done"},
            "domain": f"soak-{tenant}",
            "task_id": f"{tenant}-r{n}-t{i}",
        }
        for i in range(4)
    ]
    t0 = time.time() - history.start
    history.add(kind="rollouts_started", tenant=tenant, n=n, t0=t0)
    rec: dict[str, Any] = {"kind": "rollouts", "tenant": tenant, "n": n, "t0": t0}
    groups: list[tuple[int, str, int]] = []
    try:
        with JobsClient(base_url=base_url, api_key=key, timeout=30) as client:
            batch = client.submit_batch(tasks, samples_per_task=2, rounds=2, max_in_flight=4)
            rec["id"] = batch.id
            for group in client.groups(batch.id, poll_seconds=2.0, timeout=1800):
                groups.append((int(group["seq"]), str(group["task_id"]), int(group["round"])))
    except JobsError as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"[:300]
    history.add(**rec, groups=groups)


def paced(
    rate: float,
    stop: threading.Event,
    call: Callable[[int], None],
    failed: Callable[[int, BaseException], None],
) -> None:
    """``call(n)`` at ``rate`` per second until ``stop``, the first at once and the rest
    at Poisson arrivals; each call on a thread of its own, so that a slow answer does not
    slow the rate. (A rare driver's first call at once: a short soak holds one of each.)
    A call that raises is given to ``failed``: the driver's own failure, which the check
    counts as a violation (a record it never wrote would otherwise go unchecked)."""
    if rate <= 0:
        return
    rng = random.Random(hash((rate, id(call))))

    def guarded(n: int) -> None:
        try:
            call(n)
        except Exception as exc:
            failed(n, exc)

    for n in itertools.count():
        if n and stop.wait(rng.expovariate(rate)):
            return
        if stop.is_set():
            return
        threading.Thread(target=guarded, args=(n,), daemon=True).start()
