"""Per-key limits: requests and tokens per minute (token buckets) and concurrent requests.

Counted in Redis when it is configured, so that every gateway replica enforces the same
limit (one script call per admission; the settlement after the response is sent without
waiting), and in-process otherwise. When Redis stops answering, the gateway keeps serving
with in-process limits and says so (``tiergate_ratelimit_redis_up`` 0, a warning), and
tries Redis again every ``redis_retry_seconds``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

from tiergate.accesssettings import KeyLimits, LimitSettings

log = logging.getLogger("tiergate.limits")

# Every script reads the time from Redis: one clock for every replica, so that a replica
# whose own clock runs ahead neither purges the others' leases nor refills their buckets.
_NOW = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
"""

# KEYS: requests bucket, tokens bucket, concurrency set.
# ARGV: rpm, tpm, max_concurrent, token_cost, request_id, lease_ms.
# Returns: allowed, reason, req_remaining, req_reset_ms, tok_remaining, tok_reset_ms, retry_ms.
_ADMIT = (
    _NOW
    + """
local function peek(key, cap)
  if cap <= 0 then return -1, 0 end
  local rate = cap / 60000.0
  local d = redis.call('HMGET', key, 't', 'ts')
  local tokens = tonumber(d[1]) or cap
  local ts = tonumber(d[2]) or now
  return math.min(cap, tokens + math.max(0, now - ts) * rate), rate
end
local rpm, tpm, conc = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local rq, rrate = peek(KEYS[1], rpm)
local tk, trate = peek(KEYS[2], tpm)
local inflight = 0
if conc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  inflight = redis.call('ZCARD', KEYS[3])
end
local function reset(level, cap, rate)
  if cap <= 0 then return 0 end
  return math.ceil((cap - level) / rate)
end
if rpm > 0 and rq < 1 then
  return {0, 'requests', 0, reset(rq, rpm, rrate), math.floor(tk), reset(tk, tpm, trate),
          math.ceil((1 - rq) / rrate)}
end
if tpm > 0 and tk < cost then
  return {0, 'tokens', math.floor(rq), reset(rq, rpm, rrate), math.floor(tk),
          reset(tk, tpm, trate), math.ceil((cost - tk) / trate)}
end
if conc > 0 and inflight >= conc then
  return {0, 'concurrency', math.floor(rq), reset(rq, rpm, rrate), math.floor(tk),
          reset(tk, tpm, trate), 1000}
end
if rpm > 0 then
  rq = rq - 1
  redis.call('HSET', KEYS[1], 't', rq, 'ts', now)
  redis.call('PEXPIRE', KEYS[1], 120000)
end
if tpm > 0 then
  tk = tk - cost
  redis.call('HSET', KEYS[2], 't', tk, 'ts', now)
  redis.call('PEXPIRE', KEYS[2], 120000)
end
if conc > 0 then
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[6]), ARGV[5])
  redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[6]))
end
return {1, '', math.floor(rq), reset(rq, rpm, rrate), math.floor(tk), reset(tk, tpm, trate), 0}
"""
)

# KEYS: concurrency set. ARGV: lease_ms, then the ids of the leases still held. Only
# leases still in the set are extended (XX): one settled meanwhile is not brought back.
_RENEW = (
    _NOW
    + """
local lease = tonumber(ARGV[1])
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], 'XX', now + lease, ARGV[i])
end
redis.call('PEXPIRE', KEYS[1], lease)
return 1
"""
)

# KEYS: tokens bucket, concurrency set. ARGV: token correction (actual - estimate), id.
_SETTLE = """
if tonumber(ARGV[1]) ~= 0 and redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HINCRBYFLOAT', KEYS[1], 't', -tonumber(ARGV[1]))
end
redis.call('ZREM', KEYS[2], ARGV[2])
return 1
"""

# A concurrency lease outlives a crashed gateway by at most this long; a live one renews
# the leases of its requests in flight every third of it, so that a request holds its lease
# however long it runs.
LEASE_MS = 60 * 1000


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of an admission, with what OpenAI's ``x-ratelimit-*`` headers say."""

    allowed: bool
    reason: str
    limits: KeyLimits
    remaining_requests: int
    reset_requests_ms: int
    remaining_tokens: int
    reset_tokens_ms: int
    retry_after_ms: int
    shared: bool = False

    def headers(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.limits.requests_per_minute:
            out["x-ratelimit-limit-requests"] = str(self.limits.requests_per_minute)
            out["x-ratelimit-remaining-requests"] = str(max(0, self.remaining_requests))
            out["x-ratelimit-reset-requests"] = duration(self.reset_requests_ms)
        if self.limits.tokens_per_minute:
            out["x-ratelimit-limit-tokens"] = str(self.limits.tokens_per_minute)
            out["x-ratelimit-remaining-tokens"] = str(max(0, self.remaining_tokens))
            out["x-ratelimit-reset-tokens"] = duration(self.reset_tokens_ms)
        if not self.allowed:
            out["retry-after"] = str(max(1, math.ceil(self.retry_after_ms / 1000)))
        return out


def duration(ms: int) -> str:
    """OpenAI's duration format: ``12ms``, ``1s``, ``6m0s``."""
    if ms < 1000:
        return f"{max(0, ms)}ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.3g}s"
    return f"{int(seconds // 60)}m{int(seconds % 60)}s"


class _Bucket:
    __slots__ = ("level", "stamp")

    def __init__(self, level: float, stamp: float) -> None:
        self.level = level
        self.stamp = stamp


class LocalLimiter:
    """The same buckets as the Redis script, in this process (one per configured key)."""

    def __init__(self) -> None:
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        self._inflight: dict[str, set[str]] = {}

    def _peek(self, name: str, kind: str, cap: int | None, now: float) -> tuple[float, float]:
        if not cap:
            return -1.0, 0.0
        rate = cap / 60_000.0
        bucket = self._buckets.setdefault((name, kind), _Bucket(cap, now))
        return min(cap, bucket.level + max(0.0, now - bucket.stamp) * rate), rate

    def admit(self, name: str, limits: KeyLimits, cost: int, request_id: str) -> Decision:
        now = time.monotonic() * 1000
        rpm, tpm, conc = (
            limits.requests_per_minute,
            limits.tokens_per_minute,
            limits.max_concurrent,
        )
        rq, rrate = self._peek(name, "req", rpm, now)
        tk, trate = self._peek(name, "tok", tpm, now)
        active = self._inflight.setdefault(name, set())

        def reset(level: float, cap: int | None, rate: float) -> int:
            return math.ceil((cap - level) / rate) if cap else 0

        def decide(allowed: bool, reason: str, retry: float) -> Decision:
            return Decision(
                allowed,
                reason,
                limits,
                math.floor(rq),
                reset(rq, rpm, rrate),
                math.floor(tk),
                reset(tk, tpm, trate),
                math.ceil(retry),
            )

        if rpm and rq < 1:
            return decide(False, "requests", (1 - rq) / rrate)
        if tpm and tk < cost:
            return decide(False, "tokens", (cost - tk) / trate)
        if conc and len(active) >= conc:
            return decide(False, "concurrency", 1000)
        if rpm:
            rq -= 1
            self._buckets[(name, "req")] = _Bucket(rq, now)
        if tpm:
            tk -= cost
            self._buckets[(name, "tok")] = _Bucket(tk, now)
        if conc:
            active.add(request_id)
        return decide(True, "", 0)

    def settle(self, name: str, correction: int, request_id: str) -> None:
        bucket = self._buckets.get((name, "tok"))
        if bucket is not None:
            bucket.level -= correction
        self._inflight.get(name, set()).discard(request_id)


class Limiter:
    """Redis-backed limits with an in-process fallback.

    A concurrency lease taken in Redis expires ``lease_ms`` after its last renewal (so that
    a crashed replica's requests stop counting), and while the request runs this replica
    renews it every third of that: a stream of any length keeps counting against
    ``max_concurrent``.
    """

    def __init__(self, settings: LimitSettings, *, lease_ms: int = LEASE_MS) -> None:
        self._settings = settings
        self._local = LocalLimiter()
        self._redis = None
        self._admit = None
        self._settle = None
        self._renew = None
        self._lease_ms = lease_ms
        # Per key name, the ids of the leases this replica holds in Redis.
        self._leases: dict[str, set[str]] = {}
        self._renewing: asyncio.Task[None] | None = None
        self._down_until = 0.0
        self._pending: set[asyncio.Task[None]] = set()
        if settings.redis_url:
            import redis.asyncio as aioredis

            self._redis = aioredis.Redis.from_url(
                settings.redis_url,
                socket_timeout=settings.redis_timeout_seconds,
                socket_connect_timeout=settings.redis_timeout_seconds,
            )
            self._admit = self._redis.register_script(_ADMIT)
            self._settle = self._redis.register_script(_SETTLE)
            self._renew = self._redis.register_script(_RENEW)

    @property
    def shared(self) -> bool:
        """True while limits are counted in Redis (shared by every replica)."""
        return self._redis is not None and time.monotonic() >= self._down_until

    @property
    def configured_redis(self) -> bool:
        return self._redis is not None

    @property
    def redis_client(self) -> Any:
        """The Redis client the limits count in (None without ``limits.redis_url``): the
        spend budgets count there too (tiergate.gateway.access.budgets)."""
        return self._redis

    def redis_failed(self, exc: Exception) -> None:
        """Count in this process for ``redis_retry_seconds`` (a caller's Redis failed)."""
        self._redis_failed(exc)

    async def close(self) -> None:
        if self._renewing is not None:
            self._renewing.cancel()
            await asyncio.gather(self._renewing, return_exceptions=True)
        for task in list(self._pending):
            await asyncio.gather(task, return_exceptions=True)
        if self._redis is not None:
            await self._redis.aclose()

    async def admit(self, name: str, limits: KeyLimits, cost: int, request_id: str) -> Decision:
        if self.shared and self._admit is not None:
            keys = [
                f"tiergate:rl:{{{name}}}:req",
                f"tiergate:rl:{{{name}}}:tok",
                f"tiergate:rl:{{{name}}}:conc",
            ]
            args: list[str | int] = [
                limits.requests_per_minute or 0,
                limits.tokens_per_minute or 0,
                limits.max_concurrent or 0,
                cost,
                request_id,
                self._lease_ms,
            ]
            try:
                raw = await self._admit(keys=keys, args=args)
            except Exception as exc:  # any Redis failure: keep serving on local limits
                self._redis_failed(exc)
            else:
                allowed, reason, rq, rr, tk, tr, retry = raw
                if allowed and limits.max_concurrent:
                    self._hold(name, request_id)
                return Decision(
                    bool(allowed),
                    _text(reason),
                    limits,
                    int(rq),
                    int(rr),
                    int(tk),
                    int(tr),
                    int(retry),
                    shared=True,
                )
        return self._local.admit(name, limits, cost, request_id)

    def settle(self, name: str, correction: int, request_id: str, shared: bool) -> None:
        """Correct the token estimate and end the concurrency lease, without waiting."""
        if not shared or self._settle is None:
            self._local.settle(name, correction, request_id)
            return
        held = self._leases.get(name)
        if held is not None:
            held.discard(request_id)
            if not held:
                del self._leases[name]
        task = asyncio.ensure_future(self._settle_redis(name, correction, request_id))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _settle_redis(self, name: str, correction: int, request_id: str) -> None:
        assert self._settle is not None
        try:
            await self._settle(
                keys=[f"tiergate:rl:{{{name}}}:tok", f"tiergate:rl:{{{name}}}:conc"],
                args=[correction, request_id],
            )
        except Exception as exc:
            self._redis_failed(exc)

    def _hold(self, name: str, request_id: str) -> None:
        self._leases.setdefault(name, set()).add(request_id)
        if self._renewing is None or self._renewing.done():
            self._renewing = asyncio.ensure_future(self._renew_leases())

    async def _renew_leases(self) -> None:
        """Extend every lease held, every third of a lease, until none is held."""
        assert self._renew is not None
        while self._leases:
            await asyncio.sleep(self._lease_ms / 3000)
            for name, ids in list(self._leases.items()):
                if not ids:
                    continue
                try:
                    await self._renew(
                        keys=[f"tiergate:rl:{{{name}}}:conc"], args=[self._lease_ms, *ids]
                    )
                except Exception as exc:
                    self._redis_failed(exc)

    def _redis_failed(self, exc: Exception) -> None:
        if time.monotonic() >= self._down_until:
            log.warning(
                "redis unreachable (%s: %s); counting limits in this process for %.0fs",
                type(exc).__name__,
                exc,
                self._settings.redis_retry_seconds,
            )
        self._down_until = time.monotonic() + self._settings.redis_retry_seconds


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
