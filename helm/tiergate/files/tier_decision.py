"""The fast tier's gate: the init container of its pods, in the tuning image.

    python3 tier_decision.py OUT

Waits until a tier decision holds for this machine and these tuning inputs (the file
``tiergate tune`` wrote on the model volume, judged as ``tiergate backend --tier fast``
judges it: same hardware fingerprint, same inputs, a passing parity report for a quantized
checkpoint), saying why while it waits. Then writes the fast tier's recipe to OUT as vLLM
arguments (a JSON list: ``--model=...`` and, when it speculates, ``--speculative-config=...``).

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
import time
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from tiergate.engine.gate import ParityMissing, ensure_parity
from tiergate.evidence import TierDecision
from tiergate.settings import Settings, load_settings
from tiergate.speculative.config import SpeculativeConfig, to_vllm_json
from tiergate.tiers import Tier
from tiergate.tuning.fingerprint import digest, hardware_fingerprint
from tiergate.tuning.profiles import decided_profile
from tiergate.tuning.tuner import current_decision, inputs_digest

_SPECULATIVE: TypeAdapter[Any] = TypeAdapter(SpeculativeConfig)


def say(message: str) -> None:
    print(f"[tier-decision] {message}", file=sys.stderr, flush=True)


def decided_args(settings: Settings, decision: TierDecision) -> list[str]:
    """The decided recipe as vLLM arguments (raises ParityMissing like the launcher)."""
    profile = decided_profile(
        settings.profiles[Tier.FAST], decision, settings.profiles[Tier.STANDARD].model
    )
    ensure_parity(profile)
    args = [f"--model={profile.model}"]
    if profile.speculative is not None:
        args.append(f"--speculative-config={to_vllm_json(profile.speculative)}")
    return args


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


def waiting_for(settings: Settings) -> str:
    """Why no decision holds here yet."""
    path = settings.tuning.decision_path()
    stored = TierDecision.load(path)
    if stored is None:
        return f"no tier decision at {path} yet (the tuning Job writes it)"
    here = hardware_fingerprint()
    if stored.fingerprint_digest != digest(here):
        return f"the decision at {path} was measured on {stored.fingerprint}, this pod is {here}"
    if stored.inputs_digest != inputs_digest(settings):
        return f"the decision at {path} answers other tuning inputs (a new tuning is due)"
    return f"the decision at {path} does not hold"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        say("usage: tier_decision.py OUT")
        return 2
    out = Path(argv[1])
    mode = os.environ.get("TIERGATE_FAST_MODE", "decision")
    wait = float(os.environ.get("TIERGATE_WAIT_SECONDS", "0"))
    poll = float(os.environ.get("TIERGATE_POLL_SECONDS", "15"))
    settings = load_settings()
    started = time.monotonic()
    said = ""
    while (decision := current_decision(settings)) is None:
        reason = waiting_for(settings)
        if reason != said:
            say(f"waiting: {reason}")
            said = reason
        if wait and time.monotonic() - started >= wait:
            say(f"no decision for this hardware after {wait:g}s")
            return 2
        time.sleep(poll)
    say(f"decision: {decision.recipe_name} ({decision.verdict}): {decision.reason}")
    try:
        args = decided_args(settings, decision)
    except ParityMissing as exc:
        say(f"refusing to start: {exc}")
        return 1
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
