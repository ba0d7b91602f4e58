"""Bounded capture of a command's output.

A command may print gigabytes; the worker must not hold them. Output is read in 64 KiB
chunks as it comes and only the head and the tail are kept (errors are at the ends), so
memory stays at about ``limit`` characters whatever the command prints.
"""

from __future__ import annotations

import codecs
import os
import selectors
import time
from collections.abc import Callable
from typing import IO

CHUNK = 64 * 1024


def truncate(text: str, limit: int) -> str:
    """Keep the head and the tail, which is where errors are."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} characters cut ...]\n{text[-half:]}"


class BoundedText:
    """What :func:`truncate` would make of a stream's whole text, without keeping it."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._half = limit // 2
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._head: list[str] = []
        self._head_len = 0
        self._tail = ""
        self.total = 0  # characters seen, kept or not

    def feed(self, data: bytes, final: bool = False) -> None:
        text = self._decoder.decode(data, final)
        if not text:
            return
        self.total += len(text)
        if self._head_len < self._limit:
            piece = text[: self._limit - self._head_len]
            self._head.append(piece)
            self._head_len += len(piece)
        if self._half:
            self._tail = (self._tail + text[-self._half :])[-self._half :]

    @property
    def cut(self) -> int:
        """Characters dropped so far (as the marker counts them)."""
        return max(0, self.total - self._limit)

    def text(self) -> str:
        self.feed(b"", final=True)
        head = "".join(self._head)
        if self.total <= self._limit:
            return head
        return f"{head[: self._half]}\n[... {self.cut} characters cut ...]\n{self._tail}"


def read_bounded(
    stream: IO[bytes],
    limit: int,
    deadline: float,
    on_deadline: Callable[[], None],
    grace: float = 10.0,
) -> tuple[str, bool]:
    """Read ``stream`` to its end, keeping at most ``limit`` characters (head and tail).

    At ``deadline`` (``time.monotonic()``) ``on_deadline`` is called (it kills the command)
    and reading goes on until the pipe closes, for at most ``grace`` more seconds, so a
    process that somehow keeps the pipe open cannot hold the worker. Returns the text and
    whether the deadline was reached.
    """
    out = BoundedText(limit)
    fd = stream.fileno()
    hit = False
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            if now >= deadline:
                if hit:
                    break
                hit = True
                on_deadline()
                deadline = now + grace
            if not selector.select(deadline - now):
                continue
            chunk = os.read(fd, CHUNK)
            if not chunk:
                break
            out.feed(chunk)
    return out.text(), hit
