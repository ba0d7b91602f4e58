"""Spend budgets: tokens a day and a month, per key and per team (issue 52 item 3).

A key's ``limits.tokens_per_day`` and ``limits.tokens_per_month``, and its team's
(``auth.teams``, by the ``owner`` its keys share), are counted over UTC calendar days and
months. Before a request, what the period has spent plus the request's prompt estimate is
held against every budget that applies: past one, the request is refused with OpenAI's 429
``insufficient_quota`` (``retry-after``: when the period turns) and nothing is charged.
Admitted, the estimate is charged to each; when the answer ends the charge is corrected to
the usage vLLM reported (prompt plus completion tokens; an answer that ends without usage
keeps its estimate; one that no engine answered gives it back: Lease.refuse). A budget
can therefore be passed by at most the output of the requests already running when it ran
out. Agent jobs' and batches' model calls are made as their owner's first key
(``x-tiergate-on-behalf-of``), which need not be the key that sent the work: they count
against the team's budgets, and against the key's own only where the key has no ``owner``
(it is then its own team).

Counted in Redis where the limits are (``limits.redis_url``: every replica shares one
count; one script call per admission, the correction sent without waiting; a key's and its
team's counters share a hash slot), in-process otherwise, and in-process while Redis does
not answer, as the limits are (tiergate.gateway.access.limits).
"""

from __future__ import annotations

import asyncio
import calendar
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tiergate.accesssettings import AuthSettings, KeyLimits, TeamBudget
from tiergate.gateway.access.auth import Caller
from tiergate.gateway.access.limits import Limiter
from tiergate.gateway.errors import OpenAIError
from tiergate.protocol.openaibatch import LIMIT_HEADER

# KEYS: the counters. ARGV: the cost, then per counter its limit and its time to live.
# Returns {1, 0, spent...} when charged, {0, index, spent} for the first budget it passes.
_CHARGE = """
local cost = tonumber(ARGV[1])
local spent = {}
for i, key in ipairs(KEYS) do
  spent[i] = tonumber(redis.call('GET', key) or '0')
  if spent[i] + cost > tonumber(ARGV[2 * i]) then
    return {0, i, spent[i]}
  end
end
for i, key in ipairs(KEYS) do
  redis.call('INCRBY', key, cost)
  redis.call('EXPIRE', key, tonumber(ARGV[2 * i + 1]))
end
return {1, 0, unpack(spent)}
"""
# KEYS: the counters. ARGV: the correction (actual minus the estimate charged).
_CORRECT = """
for _, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 then
    redis.call('INCRBY', key, tonumber(ARGV[1]))
  end
end
return 1
"""
BUDGET_REMAINING = "x-tiergate-budget-remaining-tokens"
BUDGET_RESET = "x-tiergate-budget-reset-seconds"


def _turns(now: float) -> dict[str, tuple[str, float]]:
    """Each period's id and when it ends (UTC)."""
    t = time.gmtime(now)
    next_day = calendar.timegm((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0)) + 86400
    year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
    next_month = calendar.timegm((year, month, 1, 0, 0, 0))
    return {
        "day": (time.strftime("%Y-%m-%d", t), float(next_day)),
        "month": (time.strftime("%Y-%m", t), float(next_month)),
    }


def _budgeted(budget: KeyLimits | TeamBudget | None) -> bool:
    return budget is not None and bool(budget.tokens_per_day or budget.tokens_per_month)


@dataclass(frozen=True, slots=True)
class Account:
    """One budget that applies to a request, in the period under way."""

    scope: str  # "key" or "team"
    name: str
    period: str  # "day" or "month"
    limit: int
    counter: str
    resets_at: float


@dataclass(slots=True)
class Charge:
    """What one admitted request charged, corrected once when it ends."""

    accounts: list[Account]
    estimate: int
    shared: bool
    remaining: int
    reset_seconds: int
    settled: bool = False

    def headers(self) -> dict[str, str]:
        return {
            BUDGET_REMAINING: str(max(0, self.remaining)),
            BUDGET_RESET: str(self.reset_seconds),
        }


class Budgets:
    """The budgets of every key and team, and what each period has spent."""

    def __init__(
        self, auth: AuthSettings, limiter: Limiter, clock: Callable[[], float] = time.time
    ) -> None:
        self._teams = auth.teams
        self._limiter = limiter
        self._clock = clock
        # In-process counts: counter -> (spent, when its period ends).
        self._local: dict[str, tuple[int, float]] = {}
        redis = limiter.redis_client
        self._charge = redis.register_script(_CHARGE) if redis is not None else None
        self._correct = redis.register_script(_CORRECT) if redis is not None else None
        self._pending: set[asyncio.Task[None]] = set()

    def accounts(self, caller: Caller) -> list[Account]:
        key = caller.key
        if key is None:
            return []
        team = self._teams.get(key.owner) if key.owner else None
        # An agent job's or batch's call is made as its owner's first key; where several
        # keys share an owner that need not be the key that sent the work, so such calls
        # count against the team's budgets alone (a key with no owner is its own team).
        key_budget = None if caller.for_job and key.owner else key.limits
        if not _budgeted(key_budget) and not _budgeted(team):
            return []  # the usual case: no clock, no calendar on the request's path
        turns = _turns(self._clock())
        owner = key.owner_id
        found: list[Account] = []
        for scope, name, budget in (("key", key.name, key_budget), ("team", owner, team)):
            if budget is None:
                continue
            for period, limit in (
                ("day", budget.tokens_per_day),
                ("month", budget.tokens_per_month),
            ):
                if limit:
                    pid, resets_at = turns[period]
                    # One hash slot per team: a request's counters in one script call.
                    counter = f"tiergate:budget:{{{owner}}}:{scope}:{name}:{pid}"
                    found.append(Account(scope, name, period, limit, counter, resets_at))
        return found

    async def charge(self, caller: Caller, estimate: int) -> Charge | None:
        """Charge ``estimate`` to every budget of ``caller``, or raise the 429 that names
        the budget it would pass; None when no budget applies."""
        accounts = self.accounts(caller)
        if not accounts:
            return None
        spent, refused, shared = await self._spend(accounts, estimate)
        now = self._clock()
        if refused is not None:
            raise _insufficient(accounts[refused], spent[refused], estimate, now)
        left = [a.limit - s - estimate for a, s in zip(accounts, spent, strict=True)]
        tightest = min(range(len(accounts)), key=lambda i: left[i])
        reset = max(1, int(accounts[tightest].resets_at - now))
        return Charge(accounts, estimate, shared, left[tightest], reset)

    def settle(self, charge: Charge, total_tokens: int | None) -> None:
        """Correct the charge to the usage reported, once (without waiting)."""
        if charge.settled:
            return
        charge.settled = True
        correction = total_tokens - charge.estimate if isinstance(total_tokens, int) else 0
        if correction == 0:
            return
        if charge.shared and self._correct is not None:
            task = asyncio.ensure_future(self._correct_shared(charge, correction))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
            return
        for account in charge.accounts:
            spent, resets_at = self._local.get(account.counter, (0, account.resets_at))
            self._local[account.counter] = (spent + correction, resets_at)

    async def usage(self, caller: Caller) -> list[dict[str, Any]]:
        """Every budget of ``caller``: limit, spent, left and when it turns (GET /v1/usage)."""
        accounts = self.accounts(caller)
        spent, _, _ = await self._spend(accounts, 0, charge=False)
        return [
            {
                "scope": a.scope,
                "name": a.name,
                "period": a.period,
                "limit_tokens": a.limit,
                "spent_tokens": s,
                "remaining_tokens": max(0, a.limit - s),
                "resets_at": int(a.resets_at),
            }
            for a, s in zip(accounts, spent, strict=True)
        ]

    async def close(self) -> None:
        for task in list(self._pending):
            await asyncio.gather(task, return_exceptions=True)

    async def _spend(
        self, accounts: list[Account], cost: int, charge: bool = True
    ) -> tuple[list[int], int | None, bool]:
        """What each account has spent, the index of the first one ``cost`` would pass
        (None: charged to all), and whether Redis counted it."""
        if self._charge is not None and self._limiter.shared and accounts:
            try:
                if charge:
                    args: list[int] = [cost]
                    for a in accounts:
                        args += [a.limit, int(a.resets_at - self._clock()) + 3600]
                    raw = await self._charge(keys=[a.counter for a in accounts], args=args)
                    if int(raw[0]) == 0:
                        index = int(raw[1]) - 1
                        spent = [0] * len(accounts)
                        spent[index] = int(raw[2])
                        return spent, index, True
                    return [int(v) for v in raw[2:]], None, True
                redis = self._limiter.redis_client
                assert redis is not None
                values = await redis.mget([a.counter for a in accounts])
                return [int(v or 0) for v in values], None, True
            except Exception as exc:  # as the limits: keep counting in this process
                self._limiter.redis_failed(exc)
        return (*self._spend_local(accounts, cost, charge), False)

    def _spend_local(
        self, accounts: list[Account], cost: int, charge: bool
    ) -> tuple[list[int], int | None]:
        now = self._clock()
        if len(self._local) > 4 * len(accounts) + 10_000:  # past periods go
            self._local = {k: v for k, v in self._local.items() if v[1] > now}
        spent = [self._local[a.counter][0] if a.counter in self._local else 0 for a in accounts]
        if not charge:
            return spent, None
        for i, (a, s) in enumerate(zip(accounts, spent, strict=True)):
            if s + cost > a.limit:
                return spent, i
        for a, s in zip(accounts, spent, strict=True):
            self._local[a.counter] = (s + cost, a.resets_at)
        return spent, None

    async def _correct_shared(self, charge: Charge, correction: int) -> None:
        assert self._correct is not None
        try:
            await self._correct(keys=[a.counter for a in charge.accounts], args=[correction])
        except Exception as exc:
            self._limiter.redis_failed(exc)


def _insufficient(account: Account, spent: int, estimate: int, now: float) -> OpenAIError:
    reset = max(1, int(account.resets_at - now))
    whose = "This key's" if account.scope == "key" else f"Team {account.name}'s"
    return OpenAIError(
        429,
        f"You exceeded your current quota: {whose} budget of {account.limit} tokens per "
        f"{account.period} (UTC) has {max(0, account.limit - spent)} left, and this request "
        f"needs about {estimate}. It renews in {reset} s.",
        code="insufficient_quota",
        type_="insufficient_quota",
        headers={
            "retry-after": str(reset),
            BUDGET_REMAINING: str(max(0, account.limit - spent)),
            BUDGET_RESET: str(reset),
            LIMIT_HEADER: "budget",
        },
    )
