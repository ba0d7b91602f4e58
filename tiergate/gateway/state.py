"""What the gateway's routes share, and the one typed way they reach it.

The lifespan in :mod:`tiergate.gateway.app` builds a :class:`GatewayState` once per app and
installs it; route modules read it with :func:`gateway_state` instead of the untyped
``request.app.state`` (which mypy cannot check), and none of them imports the app module
for it, so the routes stand below the app rather than beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp
from starlette.applications import Starlette
from starlette.requests import HTTPConnection

from tiergate.backends.pool import TierPool
from tiergate.gateway.access.gatekeeper import Gatekeeper
from tiergate.gateway.metrics import GatewayMetrics
from tiergate.gateway.openai.proxy import CompletionsProxy
from tiergate.gateway.tierinfo import TierEvidence
from tiergate.settings import Settings
from tiergate.tiers import Tier

if TYPE_CHECKING:  # built only with jobs on (tiergate.gateway.jobs.wiring)
    from tiergate.gateway.jobs.api import JobsAPI
    from tiergate.gateway.jobs.batches import BatchesAPI
    from tiergate.gateway.jobs.files import FilesAPI
    from tiergate.gateway.jobs.openaibatch.api import BatchAPI


@dataclass(slots=True)
class GatewayState:
    """Everything a route may use; built once per app in the lifespan."""

    settings: Settings
    session: aiohttp.ClientSession
    pools: dict[Tier, TierPool]
    metrics: GatewayMetrics
    proxy: CompletionsProxy
    gatekeeper: Gatekeeper
    evidence: TierEvidence
    jobs: JobsAPI | None = None
    batches: BatchesAPI | None = None
    files: FilesAPI | None = None
    openai_batches: BatchAPI | None = None


def install_gateway_state(app: Starlette, state: GatewayState) -> None:
    """Make ``state`` what :func:`gateway_state` answers for ``app`` and its requests."""
    app.state.gateway = state


def gateway_state(where: HTTPConnection | Starlette) -> GatewayState:
    """The state of a request's app (or of the app itself); only once the lifespan has
    built it (before, an ``AttributeError``, as the untyped lookup raised)."""
    app = where.app if isinstance(where, HTTPConnection) else where
    state: GatewayState = app.state.gateway
    return state


def built_gateway_state(app: Starlette) -> GatewayState | None:
    """The app's state, or ``None`` while its lifespan has not built it (the OpenAPI
    description can be asked for before the app starts)."""
    state: GatewayState | None = getattr(app.state, "gateway", None)
    return state
