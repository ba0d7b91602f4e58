"""The fast tier's gate: the init container of its pods, in the tuning image.

    python3 tier_decision.py OUT

Waits until a tier decision holds for this machine and these tuning inputs (the file
``tiergate tune`` wrote on the model volume, judged by the plan ``tiergate backend --tier
fast`` follows, ``tiergate.tuning.plan``: same hardware fingerprint, same inputs, a passing
parity report for a quantized checkpoint), saying why while it waits. Then writes the fast
tier's recipe to OUT as vLLM arguments (a JSON list: ``--model=...`` and, when it
speculates, ``--speculative-config=...``).

Environment: ``TIERGATE_CONFIG`` (the tuner's settings), ``TIERGATE_GPU_NAME`` (the
hardware's name in the fingerprint), ``TIERGATE_FAST_MODE``: ``decision`` (the pod runs
what OUT says) or ``values`` (the pod runs ``TIERGATE_FAST_ARGS``, the recipe in the chart's
values: the gate exits 1 when the decision chose another one). ``TIERGATE_WAIT_SECONDS``
bounds the wait (exit 2; default: no bound), ``TIERGATE_POLL_SECONDS`` paces it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from tiergate.engine.gate import ParityMissing
from tiergate.evidence import TierDecision
from tiergate.measure.wait import wait_until
from tiergate.settings import load_settings
from tiergate.speculative.config import SpeculativeConfig
from tiergate.tuning.plan import Plan, tier_plan
from tiergate.tuning.plan import waiting_for as waiting_for  # why it waits (tests ask)

_SPECULATIVE: TypeAdapter[Any] = TypeAdapter(SpeculativeConfig)


def say(message: str) -> None:
    print(f"[tier-decision] {message}", file=sys.stderr, flush=True)


def _announce(decision: TierDecision) -> None:
    say(f"decision: {decision.recipe_name} ({decision.verdict}): {decision.reason}")


def _recipe(args: list[str]) -> tuple[str | None, dict[str, Any] | None]:
    model: str | None = None
    speculative: dict[str, Any] | None = None
    for arg in args:
        name, _, value = arg.partition("=")
        if name == "--model":
            model = value
        elif name == "--speculative-config":
            speculative = _SPECULATIVE.validate_json(value).model_dump()
    return model, speculative


def disagreement(decided: list[str], configured: list[str]) -> str | None:
    """Why the configured recipe is not the decided one (``None``: it is)."""
    if _recipe(decided) == _recipe(configured):
        return None
    return (
        f"the tier decision for this hardware runs {' '.join(decided)}; the fast tier's "
        f"values run {' '.join(configured)}"
    )


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        say("usage: tier_decision.py OUT")
        return 2
    out = Path(argv[1])
    mode = os.environ.get("TIERGATE_FAST_MODE", "decision")
    wait = float(os.environ.get("TIERGATE_WAIT_SECONDS", "0"))
    poll = float(os.environ.get("TIERGATE_POLL_SECONDS", "15"))
    settings = load_settings()
    said = ""

    def planned() -> Plan | None:
        nonlocal said
        plan = tier_plan(settings, announce=_announce)
        if isinstance(plan, Plan):
            return plan
        if plan.reason != said:
            say(f"waiting: {plan.reason}")
            said = plan.reason
        return None

    try:
        plan = wait_until(planned, wait or None, poll)
    except ParityMissing as exc:
        say(f"refusing to start: {exc}")
        return 1
    if plan is None:
        say(f"no decision for this hardware after {wait:g}s")
        return 2
    args = plan.recipe_args()
    if mode == "values":
        configured = json.loads(os.environ["TIERGATE_FAST_ARGS"])
        problem = disagreement(args, configured)
        if problem:
            say(
                f"refusing to start: {problem}. Set vllm.tiers.fast to the decided recipe, "
                "or tuning.fastTier=decision."
            )
            return 1
        args = configured
    out.write_text(json.dumps(args))
    say(f"the fast tier runs {' '.join(args)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
