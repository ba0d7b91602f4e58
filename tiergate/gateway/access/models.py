"""The one model check: a request's or a job's model must be served by some tier, and the
caller's key must be allowed to use it. Routes and jobs both ask here, so a model is
refused the same way whichever door it came through."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from tiergate.gateway.access.auth import Caller
from tiergate.gateway.errors import OpenAIError
from tiergate.tiers import Tier


class ReportsModels(Protocol):
    """A tier's pool, as far as the model check needs it."""

    @property
    def model_names(self) -> frozenset[str]: ...


class ServedModels:
    """The models the tiers' pools report right now."""

    def __init__(self, pools: Mapping[Tier, ReportsModels]) -> None:
        self._pools = pools

    def serves(self, model: str) -> bool:
        # A loop, not any() over a generator: on the hot path.
        for pool in self._pools.values():  # noqa: SIM110
            if model in pool.model_names:
                return True
        return False

    def names(self) -> set[str]:
        return {name for pool in self._pools.values() for name in pool.model_names}

    def check(self, caller: Caller, model: str) -> None:
        """503 while no tier has reported its models, 404 for a model no tier serves
        (naming only the models this key may use), 403 for one the key may not use."""
        if not self.serves(model):
            known = self.names()
            if not known:
                raise OpenAIError(
                    503,
                    "No tier has reported its models yet; the backends may still be starting.",
                    code="backend_unavailable",
                    headers={"retry-after": "2"},
                )
            # Only the models this key may use are named: a key learns of no others.
            usable = sorted(name for name in known if caller.may_use_model(name))
            hint = f"; available: {', '.join(usable)}" if usable else ""
            raise OpenAIError(
                404,
                f"The model {model!r} does not exist{hint}.",
                param="model",
                code="model_not_found",
            )
        if not caller.may_use_model(model):
            raise OpenAIError(
                403,
                f"This API key may not use the model {model!r}.",
                param="model",
                code="model_not_allowed",
            )
