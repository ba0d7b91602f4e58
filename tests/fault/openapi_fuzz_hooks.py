"""Schemathesis hooks for the OpenAPI fuzz test (loaded through ``SCHEMATHESIS_HOOKS``).

The description leaves ``model`` an open string (with the served models as examples), so
most generated requests would name no served model and stop at the gateway's 404. To carry
the generated shapes through the gateway to the fakes and back, each generated body names
the model a fake serves for its route: the pooling model for pooling routes, the generative
one for the rest (and every job's and batch task's, on the jobs routes). Generated bodies
seldom set ``stream``; on streaming routes, about half of
those that leave it out ask for a stream, so that the event streams are checked too.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

import schemathesis

from tests.fakes.fake_vllm import MODEL
from tiergate.gateway.openai.routes import ROUTES, RouteKind

POOLING_MODEL = "fake-embed"


@schemathesis.hook
def map_body(context: Any, body: Any) -> Any:
    operation = getattr(context, "operation", None)
    route = ROUTES.get(operation.path) if operation is not None else None
    path = operation.path if operation is not None else ""
    if path.startswith("/v1/jobs") and isinstance(body, dict):
        # A job, or each task of a batch, for the model the gateway serves.
        for item in [body, *(t for t in body.get("tasks") or [] if isinstance(t, dict))]:
            if isinstance(item.get("model"), str):
                item["model"] = MODEL
        return body
    if route is not None and isinstance(body, dict) and isinstance(body.get("model"), str):
        body["model"] = POOLING_MODEL if route.kind is RouteKind.POOLING else MODEL
        if route.streams and "stream" not in body:
            # Deterministic (a replayed case is the same case): from the body itself.
            digest = zlib.crc32(json.dumps(body, sort_keys=True, default=str).encode())
            body["stream"] = digest % 2 == 0
    return body


@schemathesis.serializer("application/jsonl")
def jsonl(context: Any, value: Any) -> bytes:
    """A tasks file (POST /v1/jobs/batches/tasks): each generated item as one JSON line."""
    items = value if isinstance(value, list) else [value]
    return b"".join(json.dumps(item, default=str).encode() + b"\n" for item in items)
