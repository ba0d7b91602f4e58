"""API keys: ``Authorization: Bearer <key>``, checked against configured SHA-256 hashes.

Keys come from the settings and, with ``auth.keys_file``, from a file (the chart's mounted
Secret) that is read again whenever it changes, so rotating keys needs no restart.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from tiergate.accesssettings import ApiKey, AuthSettings
from tiergate.gateway.errors import OpenAIError
from tiergate.tiers import Tier

log = logging.getLogger("tiergate.auth")
_KEY_LIST = TypeAdapter(list[ApiKey])

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
    # An agent job's model call (a worker's key naming the job's owner): served last where
    # requests share a queue (tiergate.tiers.JOB_URGENCY).
    for_job: bool = False

    @property
    def owner(self) -> str:
        """The tenant whose jobs, uploads and batches this caller reaches (the key's stable
        :attr:`ApiKey.owner_id`, never its name); limits, logs and metrics go by name."""
        return self.name if self.key is None else self.key.owner_id

    def may_use_tier(self, tier: Tier) -> bool:
        return self.key is None or tier in self.key.tiers

    def may_use_model(self, model: str) -> bool:
        return self.key is None or self.key.models is None or model in self.key.models

    @property
    def priority(self) -> int:
        return 0 if self.key is None else self.key.priority

    @property
    def weight(self) -> float:
        return 1.0 if self.key is None else self.key.weight


ANONYMOUS = Caller("anonymous", None)


class KeysFileError(RuntimeError):
    """``auth.keys_file`` cannot be read, is not a list of keys, or repeats a key."""


class Authenticator:
    """Maps a presented key to its configuration. The key is never stored or logged.

    With ``keys_file``, the file is read at construction (an unusable file is an error
    then) and looked at again at most every ``keys_reload_seconds`` when a key is checked:
    new content replaces the file's keys, so a revoked key stops working within that time.
    A file that later cannot be read or parsed (a rotation caught half-written) leaves the
    keys as they were, and says so in the log."""

    def __init__(
        self, settings: AuthSettings, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._enabled = settings.enabled
        self._settings = settings
        self._clock = clock
        self._file = Path(settings.keys_file) if settings.keys_file else None
        self._file_content: bytes | None = None
        self._checked_at = clock()
        self._by_hash: dict[str, ApiKey] = {}
        self._by_owner: dict[str, ApiKey] = {}
        self._install(self._read_file() if self._file is not None else [])

    def _install(self, from_file: list[ApiKey]) -> None:
        keys = [*self._settings.keys, *from_file]
        self._by_hash = {key.hash: key for key in keys}
        # Keys sharing an owner (set so on purpose): the first configured one stands for
        # the owner's jobs, so such keys should be given the same tiers and models.
        self._by_owner = {}
        for key in keys:
            self._by_owner.setdefault(key.owner_id, key)

    def _read_file(self) -> list[ApiKey]:
        assert self._file is not None
        try:
            content = self._file.read_bytes()
            keys = _KEY_LIST.validate_json(content)
            # The settings' own checks (unique names and hashes) over both sources.
            AuthSettings(
                enabled=self._enabled,
                keys=[*self._settings.keys, *keys],
                keys_file=str(self._file),
                prices=self._settings.prices,
            )
        except (OSError, ValidationError) as exc:
            raise KeysFileError(f"auth.keys_file {self._file}: {exc}") from exc
        self._file_content = content
        return keys

    def _refresh(self) -> None:
        """Re-read the keys file when it is due and its content changed."""
        if self._file is None:
            return
        now = self._clock()
        if now - self._checked_at < self._settings.keys_reload_seconds:
            return
        self._checked_at = now
        try:
            if self._file.read_bytes() == self._file_content:
                return
            keys = self._read_file()
        except (OSError, KeysFileError) as exc:
            log.error("keeping the current API keys: %s", exc)
            return
        self._install(keys)
        log.info("API keys reloaded from %s (%d from the file)", self._file, len(keys))

    @property
    def enabled(self) -> bool:
        return self._enabled

    def authenticate(self, authorization: str | None, on_behalf_of: str | None = None) -> Caller:
        """The caller a request counts against: the key presented, or, for a job worker's
        key naming a job's owner, that owner."""
        self._refresh()
        caller = self._authenticate(authorization)
        if not on_behalf_of:
            return caller
        if caller.key is None:  # auth off: saying so can only put the caller last
            return Caller(caller.name, None, for_job=True)
        if not caller.key.acts_for_job_owners:
            raise OpenAIError(
                403,
                f"This API key may not send {ON_BEHALF_OF}.",
                code="on_behalf_of_not_allowed",
            )
        owner = self._by_owner.get(on_behalf_of)
        if owner is None:
            raise OpenAIError(403, "The job's owner no longer has a key.", code="owner_unknown")
        return Caller(owner.name, owner, for_job=True)

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
