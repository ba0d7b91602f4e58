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

A budget in dollars (``spend_per_day``, ``spend_per_month``) is the same, with each token
at the price of the tier that served it (``auth.prices``, dollars per million tokens): a
request is held against it at its estimate's price on the tier chosen, and corrected with
the price of the tier that answered (the policy may move it). Counted in micro-dollars
(a dollar per million tokens is a micro-dollar a token), rounded up.

Counted in Redis where the limits are (``limits.redis_url``: every replica shares one
count; one script call per admission, the correction sent without waiting; a key's and its
team's counters share a hash slot), in-process otherwise, and in-process while Redis does
not answer, as the limits are (tiergate.gateway.access.limits).
"""

from __future__ import annotations

import asyncio
import calendar
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tiergate.accesssettings import AuthSettings, KeyLimits, TeamBudget
from tiergate.gateway.access.auth import Caller
from tiergate.gateway.access.limits import Limiter
from tiergate.gateway.errors import OpenAIError
from tiergate.protocol.openaibatch import LIMIT_HEADER
from tiergate.tiers import Tier

# KEYS: the counters. ARGV: per counter its cost, its limit and its time to live.
# Returns {1, 0, spent...} when charged, {0, index, spent} for the first budget it passes.
_CHARGE = """
local spent = {}
for i, key in ipairs(KEYS) do
  spent[i] = tonumber(redis.call('GET', key) or '0')
  if spent[i] + tonumber(ARGV[3 * i - 2]) > tonumber(ARGV[3 * i - 1]) then
    return {0, i, spent[i]}
  end
end
for i, key in ipairs(KEYS) do
  redis.call('INCRBY', key, tonumber(ARGV[3 * i - 2]))
  redis.call('EXPIRE', key, tonumber(ARGV[3 * i]))
end
return {1, 0, unpack(spent)}
"""
# KEYS: the counters. ARGV: per counter its correction (actual minus what was charged).
_CORRECT = """
for i, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 then
    redis.call('INCRBY', key, tonumber(ARGV[i]))
  end
end
return 1
"""
BUDGET_REMAINING = "x-tiergate-budget-remaining-tokens"
BUDGET_REMAINING_USD = "x-tiergate-budget-remaining-usd"
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
    return budget is not None and bool(
        budget.tokens_per_day
        or budget.tokens_per_month
        or budget.spend_per_day
        or budget.spend_per_month
    )


def _limits(budget: KeyLimits | TeamBudget) -> list[tuple[str, str, int | None]]:
    """(period, unit, limit in the unit's integer count) of each budget that is set."""
    return [
        ("day", "tokens", budget.tokens_per_day),
        ("month", "tokens", budget.tokens_per_month),
        ("day", "usd", _micro(budget.spend_per_day)),
        ("month", "usd", _micro(budget.spend_per_month)),
    ]


def _micro(dollars: float | None) -> int | None:
    return None if dollars is None else max(1, round(dollars * 1_000_000))


def _dollars(micro: int) -> float:
    return round(micro / 1_000_000, 6)


def _usd(micro: int) -> str:
    """Micro-dollars as a message says them: $25, $0.00001 (never 1e-05)."""
    return "$" + f"{micro / 1_000_000:.6f}".rstrip("0").rstrip(".")


@dataclass(frozen=True, slots=True)
class Account:
    """One budget that applies to a request, in the period under way."""

    scope: str  # "key" or "team"
    name: str
    period: str  # "day" or "month"
    limit: int  # tokens, or micro-dollars
    counter: str
    resets_at: float
    unit: str = "tokens"  # or "usd"


@dataclass(slots=True)
class Charge:
    """What one admitted request charged, corrected once when it ends."""

    accounts: list[Account]
    costs: list[int]  # charged to each account, in its unit
    shared: bool
    left: list[int]  # each account's room after the charge
    reset_seconds: int
    settled: bool = False

    def headers(self) -> dict[str, str]:
        """What the tightest budget of each unit has left, and when the tightest of all
        (the least room for its size) turns."""
        found = {BUDGET_RESET: str(self.reset_seconds)}
        pairs = list(zip(self.accounts, self.left, strict=True))
        tokens = [left for a, left in pairs if a.unit == "tokens"]
        usd = [left for a, left in pairs if a.unit == "usd"]
        if tokens:
            found[BUDGET_REMAINING] = str(max(0, min(tokens)))
        if usd:
            found[BUDGET_REMAINING_USD] = f"{_dollars(max(0, min(usd))):.6f}"
        return found


class Budgets:
    """The budgets of every key and team, and what each period has spent."""

    def __init__(
        self, auth: AuthSettings, limiter: Limiter, clock: Callable[[], float] = time.time
    ) -> None:
        self._teams = auth.teams
        self.prices = auth.prices
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
            for period, unit, limit in _limits(budget):
                if limit:
                    pid, resets_at = turns[period]
                    # One hash slot per team: a request's counters in one script call.
                    suffix = "" if unit == "tokens" else f":{unit}"
                    counter = f"tiergate:budget:{{{owner}}}:{scope}:{name}:{pid}{suffix}"
                    found.append(Account(scope, name, period, limit, counter, resets_at, unit))
        return found

    def cost(self, account: Account, tokens: int, tier: Tier) -> int:
        """``tokens`` served on ``tier`` in ``account``'s unit (micro-dollars rounded up)."""
        if account.unit == "tokens":
            return tokens
        # Settings require a price for every tier once a spend budget is set. Rounded to the
        # micro-dollar first: 100 tokens at 0.07 is 7.000000000000001 in binary, not 8.
        return math.ceil(round(tokens * self.prices[tier], 6))

    async def charge(self, caller: Caller, estimate: int, tier: Tier) -> Charge | None:
        """Charge ``estimate`` tokens on ``tier`` to every budget of ``caller``, or raise
        the 429 that names the budget it would pass; None when no budget applies."""
        accounts = self.accounts(caller)
        if not accounts:
            return None
        costs = [self.cost(a, estimate, tier) for a in accounts]
        spent, refused, shared = await self._spend(accounts, costs)
        now = self._clock()
        if refused is not None:
            raise _insufficient(accounts[refused], spent[refused], costs[refused], now)
        left = [a.limit - s - c for a, s, c in zip(accounts, spent, costs, strict=True)]
        tightest = min(range(len(accounts)), key=lambda i: left[i] / accounts[i].limit)
        reset = max(1, int(accounts[tightest].resets_at - now))
        return Charge(accounts, costs, shared, left, reset)

    def settle(self, charge: Charge, total_tokens: int | None, tier: Tier) -> None:
        """Correct the charge to the tokens reported on ``tier`` (the one that answered),
        once, without waiting. Without a count (``None``) the estimate stands; 0 gives the
        charge back."""
        if charge.settled:
            return
        charge.settled = True
        if not isinstance(total_tokens, int):
            return
        corrections = [
            self.cost(a, total_tokens, tier) - c
            for a, c in zip(charge.accounts, charge.costs, strict=True)
        ]
        if not any(corrections):
            return
        if charge.shared and self._correct is not None:
            task = asyncio.ensure_future(self._correct_shared(charge, corrections))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
            return
        for account, correction in zip(charge.accounts, corrections, strict=True):
            spent, resets_at = self._local.get(account.counter, (0, account.resets_at))
            self._local[account.counter] = (spent + correction, resets_at)

    async def usage(self, caller: Caller) -> list[dict[str, Any]]:
        """Every budget of ``caller``: limit, spent, left and when it turns (GET /v1/usage)."""
        accounts = self.accounts(caller)
        spent, _, _ = await self._spend(accounts, [0] * len(accounts), charge=False)
        found: list[dict[str, Any]] = []
        for a, s in zip(accounts, spent, strict=True):
            entry: dict[str, Any] = {"scope": a.scope, "name": a.name, "period": a.period}
            entry["unit"] = a.unit
            if a.unit == "usd":
                entry["limit_usd"] = _dollars(a.limit)
                entry["spent_usd"] = _dollars(s)
                entry["remaining_usd"] = _dollars(max(0, a.limit - s))
            else:
                entry["limit_tokens"] = a.limit
                entry["spent_tokens"] = s
                entry["remaining_tokens"] = max(0, a.limit - s)
            entry["resets_at"] = int(a.resets_at)
            found.append(entry)
        return found

    async def close(self) -> None:
        for task in list(self._pending):
            await asyncio.gather(task, return_exceptions=True)

    async def _spend(
        self, accounts: list[Account], costs: list[int], charge: bool = True
    ) -> tuple[list[int], int | None, bool]:
        """What each account has spent, the index of the first one its cost would pass
        (None: charged to all), and whether Redis counted it."""
        if self._charge is not None and self._limiter.shared and accounts:
            try:
                if charge:
                    args: list[int] = []
                    for a, cost in zip(accounts, costs, strict=True):
                        args += [cost, a.limit, int(a.resets_at - self._clock()) + 3600]
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
        return (*self._spend_local(accounts, costs, charge), False)

    def _spend_local(
        self, accounts: list[Account], costs: list[int], charge: bool
    ) -> tuple[list[int], int | None]:
        now = self._clock()
        if len(self._local) > 4 * len(accounts) + 10_000:  # past periods go
            self._local = {k: v for k, v in self._local.items() if v[1] > now}
        spent = [self._local[a.counter][0] if a.counter in self._local else 0 for a in accounts]
        if not charge:
            return spent, None
        for i, (a, s, cost) in enumerate(zip(accounts, spent, costs, strict=True)):
            if s + cost > a.limit:
                return spent, i
        for a, s, cost in zip(accounts, spent, costs, strict=True):
            self._local[a.counter] = (s + cost, a.resets_at)
        return spent, None

    async def _correct_shared(self, charge: Charge, corrections: list[int]) -> None:
        assert self._correct is not None
        try:
            await self._correct(keys=[a.counter for a in charge.accounts], args=corrections)
        except Exception as exc:
            self._limiter.redis_failed(exc)


def _insufficient(account: Account, spent: int, cost: int, now: float) -> OpenAIError:
    reset = max(1, int(account.resets_at - now))
    whose = "This key's" if account.scope == "key" else f"Team {account.name}'s"
    left = max(0, account.limit - spent)
    if account.unit == "usd":
        amounts = (_usd(account.limit), _usd(left), _usd(cost))
        remaining = {BUDGET_REMAINING_USD: f"{_dollars(left):.6f}"}
    else:
        amounts = (f"{account.limit} tokens", str(left), str(cost))
        remaining = {BUDGET_REMAINING: str(left)}
    return OpenAIError(
        429,
        f"You exceeded your current quota: {whose} budget of {amounts[0]} per "
        f"{account.period} (UTC) has {amounts[1]} left, and this request needs about "
        f"{amounts[2]}. It renews in {reset} s.",
        code="insufficient_quota",
        type_="insufficient_quota",
        headers={
            "retry-after": str(reset),
            **remaining,
            BUDGET_RESET: str(reset),
            LIMIT_HEADER: "budget",
        },
    )
