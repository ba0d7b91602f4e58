"""API keys: ``Authorization: Bearer <key>``, checked against configured SHA-256 hashes."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from tiergate.gateway.errors import OpenAIError
from tiergate.settings import ApiKey, AuthSettings
from tiergate.tiers import Tier

KEY_PREFIX = "tg-"
ON_BEHALF_OF = "x-tiergate-on-behalf-of"


def hash_key(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def new_key() -> tuple[str, str]:
    """A fresh random key and the hash to configure for it."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    return key, hash_key(key)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is calling: a configured key, or the anonymous caller when auth is off."""

    name: str
    key: ApiKey | None

    def may_use_tier(self, tier: Tier) -> bool:
        return self.key is None or tier in self.key.tiers

    def may_use_model(self, model: str) -> bool:
        return self.key is None or self.key.models is None or model in self.key.models

    @property
    def priority(self) -> int:
        return 0 if self.key is None else self.key.priority


ANONYMOUS = Caller("anonymous", None)


class Authenticator:
    """Maps a presented key to its configuration. The key is never stored or logged."""

    def __init__(self, settings: AuthSettings) -> None:
        self._enabled = settings.enabled
        self._by_hash = {key.hash: key for key in settings.keys}
        self._by_name = {key.name: key for key in settings.keys}

    @property
    def enabled(self) -> bool:
        return self._enabled

    def authenticate(self, authorization: str | None, on_behalf_of: str | None = None) -> Caller:
        """The caller a request counts against: the key presented, or, for a job worker's
        key naming a job's owner, that owner."""
        caller = self._authenticate(authorization)
        if not on_behalf_of or caller.key is None:
            return caller
        if not caller.key.acts_for_job_owners:
            raise OpenAIError(
                403,
                f"This API key may not send {ON_BEHALF_OF}.",
                code="on_behalf_of_not_allowed",
            )
        owner = self._by_name.get(on_behalf_of)
        if owner is None:
            raise OpenAIError(403, "The job's owner no longer has a key.", code="owner_unknown")
        return Caller(owner.name, owner)

    def _authenticate(self, authorization: str | None) -> Caller:
        if not self._enabled:
            return ANONYMOUS
        if not authorization:
            raise OpenAIError(
                401,
                "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'.",
                code="missing_api_key",
                type_="invalid_request_error",
            )
        scheme, _, token = authorization.partition(" ")
        presented = hash_key(token.strip()) if scheme.lower() == "bearer" else ""
        # A dict lookup on the hash leaks nothing useful about a key; the final comparison
        # is constant-time all the same.
        key = self._by_hash.get(presented)
        if key is None or not hmac.compare_digest(key.hash, presented):
            raise OpenAIError(
                401,
                "Incorrect API key provided.",
                code="invalid_api_key",
                type_="invalid_request_error",
            )
        return Caller(key.name, key)

    def check_model(self, caller: Caller, model: str) -> None:
        """403 for a model the key may not use (its tiers are the tier policy's business)."""
        if not caller.may_use_model(model):
            raise OpenAIError(
                403,
                f"This API key may not use the model {model!r}.",
                param="model",
                code="model_not_allowed",
            )
