"""The worker's side of OpenAI batches: one chunk of a batch's lines, run through the
gateway, answered once.

Each line is sent to the gateway as the batch's owner (the workers' key, on behalf of the
owner: the owner's models, tiers and limits apply) without its ``service_tier``, so it is
served at the agent jobs' urgency: after every interactive request, on the same engines.
The gateway's capacity answers (429, 503) and connection failures are retried with backoff
for up to ``batch_api.line_patience_seconds``; any other answer is the line's answer: 2xx
to the output file, the rest to the error file, as OpenAI writes them. A 429 of the
owner's own rates (``rate_limit_exceeded`` for its requests or tokens per minute) is the
line's answer at once: retried in place, a throttled key's chunk held the worker's batch
capacity for as long as its lines' patience (half an hour for 64 lines) while every other
tenant's chunks waited behind it. The owner's concurrency limit is waited out as capacity
is: its slots free as its own requests, running, end.
Lines are split on ``\n`` alone, as the gateway checked them (``\r`` is JSON whitespace).
Lines not begun when the batch is cancelled or expires are skipped (in neither file). The
chunk's answers are written once (:meth:`LineBatchStore.put_chunk`); a chunk already
answered is not run again.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import orjson

from tiergate.jobs.lines.metrics import LineMetrics
from tiergate.jobs.lines.store import ChunkCounts, LineBatchStore
from tiergate.jobs.state.files import FileStore
from tiergate.jobs.state.store import StorageError
from tiergate.jobsettings import BatchApiSettings
from tiergate.protocol.openaibatch import FINAL, LIMIT_HEADER, ChunkMessage

log = logging.getLogger("tiergate.lines")

_RETRIED = frozenset({429, 502, 503, 504})
_STATUS_EVERY_SECONDS = 2.0


def request_id_of(batch_id: str, line: int) -> str:
    return "batch_req_" + hashlib.sha256(f"{batch_id}/{line}".encode()).hexdigest()[:32]


def counts_of(body: bytes) -> ChunkCounts:
    """A stored chunk's counts (the same for whoever reads it)."""
    completed = failed = skipped = input_tokens = output_tokens = 0
    for raw in body.splitlines():
        entry = orjson.loads(raw)
        kind = entry["t"]
        if kind == "s":
            skipped += 1
            continue
        if kind == "o":
            completed += 1
        else:
            failed += 1
        usage = ((entry["l"].get("response") or {}).get("body") or {}).get("usage") or {}
        input_tokens += int(usage.get("prompt_tokens", usage.get("input_tokens", 0)) or 0)
        output_tokens += int(usage.get("completion_tokens", usage.get("output_tokens", 0)) or 0)
    return ChunkCounts(completed, failed, skipped, input_tokens, output_tokens)


class ChunkRunner:
    """Runs chunk records for one worker; :meth:`run` returns when the chunk is answered
    (or was already), or raises when it should be tried again (storage down, stopping)."""

    def __init__(
        self,
        settings: BatchApiSettings,
        lines: LineBatchStore,
        files: FileStore,
        gateway_url: str,
        key: Callable[[], str | None],
        stopping: threading.Event,
        metrics: LineMetrics | None = None,
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._lines = lines
        self._files = files
        self._key = key
        self._stopping = stopping
        self._client = httpx.Client(
            base_url=gateway_url.rstrip("/"),
            timeout=httpx.Timeout(settings.line_timeout_seconds, connect=5.0),
        )
        self._pool = ThreadPoolExecutor(settings.line_concurrency, thread_name_prefix="batch-line")

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()

    def run(self, msg: ChunkMessage, beat: Callable[[], None] = lambda: None) -> str:
        """Answer chunk ``msg``; what happened (``answered``, ``already``, ``gone``)."""
        started = time.monotonic()
        result = self._run(msg, beat)
        if self._metrics is not None:
            self._metrics.chunks_total.labels(result).inc()
            if result == "answered":
                self._metrics.chunk_seconds.observe(time.monotonic() - started)
        return result

    def _run(self, msg: ChunkMessage, beat: Callable[[], None]) -> str:
        done = self._lines.chunk(msg.owner, msg.batch_id, msg.chunk)
        if done is not None:  # answered before (a redelivery): make sure it is counted
            self._lines.mark_done(msg.owner, msg.batch_id, msg.chunk, counts_of(done))
            return "already"
        got = self._lines.get(msg.owner, msg.batch_id)
        if got is None or got[0]["status"] in FINAL:
            # Its creation failed after the record was sent, or it ended (its answers are
            # in its files, and a redelivered chunk must not write them again).
            return "gone"
        raw = self._files.content_range(msg.owner, msg.input_file_id, msg.start, msg.end)
        if raw is None:  # the owner deleted the input file: each line is still answered once
            self._write(msg, _input_gone(msg))
            return "answered"
        lines = _lines_of(raw)
        stop = _Stop(self, msg)
        stop.seen(str(got[0]["status"]))
        futures = [
            self._pool.submit(self._line, msg, msg.first_line + i, line, stop)
            for i, line in enumerate(lines)
        ]
        answers: list[dict[str, Any]] = []
        for future in futures:
            while True:
                try:
                    answers.append(future.result(timeout=1.0))
                    break
                except TimeoutError:
                    beat()
                    stop.check()
        if self._stopping.is_set() and any(a["t"] == "s" and not stop.final for a in answers):
            raise InterruptedError("the worker is stopping: the chunk runs again elsewhere")
        self._write(msg, answers)
        return "answered"

    def fail(self, msg: ChunkMessage, code: str) -> None:
        """Answer every line of chunk ``msg`` as an error (a chunk that cannot be run)."""
        raw = self._files.content_range(msg.owner, msg.input_file_id, msg.start, msg.end)
        if raw is None:
            self._write(msg, _input_gone(msg))
            return
        lines = _lines_of(raw)
        answers = []
        for i, line in enumerate(lines):
            try:
                custom_id = orjson.loads(line).get("custom_id")
            except orjson.JSONDecodeError:
                custom_id = None
            answers.append(
                {
                    "t": "e",
                    "l": {
                        "id": request_id_of(msg.batch_id, msg.first_line + i),
                        "custom_id": custom_id,
                        "response": None,
                        "error": {"code": code, "message": "The request could not be run."},
                    },
                }
            )
        self._write(msg, answers)
        if self._metrics is not None:
            self._metrics.chunks_total.labels("failed").inc()

    def _write(self, msg: ChunkMessage, answers: list[dict[str, Any]]) -> None:
        """The chunk's answers, unless another run wrote them first (then theirs stand);
        then its counts, from what was stored."""
        body = b"\n".join(orjson.dumps(a) for a in answers)
        won = self._lines.put_chunk(msg.owner, msg.batch_id, msg.chunk, body)
        if not won:
            body = self._lines.chunk(msg.owner, msg.batch_id, msg.chunk) or body
        counts = counts_of(body)
        self._lines.mark_done(msg.owner, msg.batch_id, msg.chunk, counts)
        if won and self._metrics is not None:
            self._metrics.answered(counts)

    def _line(self, msg: ChunkMessage, number: int, raw: bytes, stop: _Stop) -> dict[str, Any]:
        line = orjson.loads(raw)
        custom_id = line.get("custom_id")
        body = dict(line.get("body") or {})
        body.pop("service_tier", None)  # a batch line is patient whatever it says
        if body.get("stream"):
            body["stream"] = False
        deadline = min(time.time() + self._settings.line_patience_seconds, msg.expires_at)
        delay = 1.0
        while True:
            if stop.check():
                return {"t": "s", "n": number}
            key = self._key()
            headers = {"x-tiergate-on-behalf-of": msg.owner}
            if key:
                headers["authorization"] = f"Bearer {key}"
            try:
                resp = self._client.post(msg.endpoint, content=orjson.dumps(body), headers=headers)
            except httpx.TransportError as exc:
                failure = f"{type(exc).__name__}"
                resp = None
            if resp is not None and (resp.status_code not in _RETRIED or _own_limit(resp)):
                return self._answer(msg, number, custom_id, resp)
            if resp is not None:
                failure = f"HTTP {resp.status_code}"
            if time.time() + delay > deadline:
                return {
                    "t": "e",
                    "l": {
                        "id": request_id_of(msg.batch_id, number),
                        "custom_id": custom_id,
                        "response": None if resp is None else _response(resp),
                        "error": {
                            "code": "request_failed",
                            "message": f"The gateway did not take the request in time ({failure}).",
                        },
                    },
                }
            self._stopping.wait(delay)
            delay = min(delay * 2, 30.0)

    def _answer(
        self, msg: ChunkMessage, number: int, custom_id: Any, resp: httpx.Response
    ) -> dict[str, Any]:
        ok = 200 <= resp.status_code < 300
        return {
            "t": "o" if ok else "e",
            "l": {
                "id": request_id_of(msg.batch_id, number),
                "custom_id": custom_id,
                "response": _response(resp),
                "error": None,
            },
        }

    def status(self, msg: ChunkMessage) -> str | None:
        got = self._lines.get(msg.owner, msg.batch_id)
        return None if got is None else str(got[0]["status"])


def _input_gone(msg: ChunkMessage) -> list[dict[str, Any]]:
    """The chunk's answers when the batch's input file was deleted before it ran: one error
    a line, so that completed + failed still adds up to the batch's total."""
    message = f"The batch's input file {msg.input_file_id} was deleted before this line ran."
    return [
        {
            "t": "e",
            "l": {
                "id": request_id_of(msg.batch_id, msg.first_line + i),
                "custom_id": None,
                "response": None,
                "error": {"code": "input_file_deleted", "message": message},
            },
        }
        for i in range(msg.lines or 0)
    ]


def _lines_of(raw: bytes | None) -> list[bytes]:
    """A chunk's lines as the gateway's check counted them: split on ``\n`` alone, blank
    ones left out."""
    return [] if raw is None else [line for line in raw.split(b"\n") if line.strip()]


def _own_limit(resp: httpx.Response) -> bool:
    """A 429 of the owner's own rates (requests or tokens per minute) or spent budget
    (``insufficient_quota``): not capacity, nor its concurrency (the gateway names the
    limit in ``x-tiergate-limit``)."""
    return resp.status_code == 429 and resp.headers.get(LIMIT_HEADER) in (
        "requests",
        "tokens",
        "budget",
    )


def _response(resp: httpx.Response) -> dict[str, Any]:
    try:
        body: Any = resp.json()
    except ValueError:
        body = {"error": {"message": resp.text[:1000], "type": "server_error"}}
    return {
        "status_code": resp.status_code,
        "request_id": resp.headers.get("x-request-id", ""),
        "body": body,
    }


class _Stop:
    """Whether the chunk's lines not begun should be skipped: the batch was cancelled or
    expired (``final``), or the worker is stopping. The batch's status is read at most every
    few seconds, by whichever line asks."""

    def __init__(self, runner: ChunkRunner, msg: ChunkMessage) -> None:
        self._runner = runner
        self._msg = msg
        self._lock = threading.Lock()
        self._read_at = time.monotonic()
        self.final = False

    def seen(self, status: str | None) -> None:
        if status is None or status == "cancelling" or status in FINAL:
            self.final = True

    def check(self) -> bool:
        if self.final or self._runner.stopping:
            return True
        if time.time() >= self._msg.expires_at:
            self.final = True
            return True
        with self._lock:
            if time.monotonic() - self._read_at < _STATUS_EVERY_SECONDS:
                return False
            self._read_at = time.monotonic()
        try:
            status = self._runner.status(self._msg)
        except StorageError:
            return False
        self.seen(status)
        return self.final
