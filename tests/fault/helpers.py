from __future__ import annotations

import re
from typing import Any

import httpx


def metric_value(base: str, name: str, **labels: str) -> float:
    """Sum of a gateway metric's samples whose labels include ``labels``."""
    text = httpx.get(f"{base}/metrics").text
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.rsplit(" ", 1)[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def sse_events(text: str) -> list[str]:
    return [part[len("data: ") :] for part in text.split("\n\n") if part.startswith("data: ")]


def load_seen(fake: Any) -> bool:
    """Whether the gateway has read ``fake``'s load (``running``, ``waiting``): its
    /metrics was probed twice, so the first answer was taken in before the second round."""
    return sum(1 for path, _ in fake.record.probes if path == "/metrics") >= 2
