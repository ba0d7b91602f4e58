"""vLLM's ``cache_salt`` per tenant: a prefix cached for one tenant is never a hit for another.

vLLM reuses the KV cache of any earlier request that shares a prompt's leading blocks, and
a hit answers measurably sooner. Shared between tenants, that lets one tenant time its own
requests to learn whether another recently sent a given prefix (a system prompt, a
document, a user's message). vLLM mixes ``cache_salt`` into the hashes of the first
blocks, so requests share cached blocks only when their salts are equal. The gateway sets
it on every generation route from the owner of the caller's key (a job's model calls
carry their owner's), overriding whatever the caller sent: tenants keep their own cache
hits and never reach another's.

The salt is a keyed hash (HMAC-SHA256) of the owner: one who can reach an engine directly
cannot compute another tenant's salt from its name. Replicas that share
``routing.cache_salt_secret`` give a tenant the same salt (its cache hits hold across
them); without one each process draws its own key, which is as safe and costs a tenant
its hits across replicas.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets


class CacheSalts:
    """The ``cache_salt`` of each tenant, keyed by ``secret`` (random per process if None)."""

    def __init__(self, secret: str | None = None) -> None:
        self._key = secret.encode() if secret else secrets.token_bytes(32)

    def of(self, owner: str) -> str:
        return hmac.new(self._key, owner.encode(), hashlib.sha256).hexdigest()[:32]
