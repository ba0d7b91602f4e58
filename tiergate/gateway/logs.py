"""Structured logging: one JSON object per line."""

from __future__ import annotations

import asyncio
import logging
import math
import sys
import time
from datetime import UTC, datetime
from typing import Any, BinaryIO

import orjson


class JsonFormatter(logging.Formatter):
    """Formats a record and any ``extra={"fields": {...}}`` as one JSON line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


class AccessLog:
    """One JSON line per request, written in batches.

    Lines are buffered and written at most ``flush_seconds`` after the first unwritten one,
    so that a busy gateway does not pay a write system call (and the logging module's
    record machinery) per request. Created per app; flushed when the app stops.
    """

    def __init__(self, stream: BinaryIO, flush_seconds: float = 0.2) -> None:
        self._stream = stream
        self._flush_seconds = flush_seconds
        self._lines: list[bytes] = []
        self._timer: asyncio.TimerHandle | None = None

    def write(self, fields: dict[str, Any]) -> None:
        now = time.time()
        entry = {"ts": _iso(now), "level": "info", "logger": "tiergate.access", **fields}
        self._lines.append(orjson.dumps(entry, default=str) + b"\n")
        if self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                self.flush()
                return
            self._timer = loop.call_later(self._flush_seconds, self.flush)

    def flush(self) -> None:
        self._timer = None
        if self._lines:
            data, self._lines = b"".join(self._lines), []
            self._stream.write(data)
            self._stream.flush()


_second: list[Any] = [None, ""]  # the last whole second formatted, and its text


def _iso(epoch: float) -> str:
    """``datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds")``, with the
    date and time formatted once per second rather than once per request."""
    frac, whole_f = math.modf(epoch)  # as datetime.fromtimestamp rounds it
    micros = round(frac * 1e6)
    whole = int(whole_f)
    if micros >= 1_000_000:
        whole, micros = whole + 1, micros - 1_000_000
    if _second[0] != whole:
        _second[0] = whole
        _second[1] = datetime.fromtimestamp(whole, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{_second[1]}.{micros // 1000:03d}+00:00"
