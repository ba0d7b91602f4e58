"""The two speed tiers and how OpenAI's ``service_tier`` words map onto them."""

from __future__ import annotations

from enum import StrEnum


class Tier(StrEnum):
    """A pool of engines with the same capabilities and a different speed."""

    STANDARD = "standard"
    FAST = "fast"

    @property
    def openai_name(self) -> str:
        """The word echoed in responses' ``service_tier``."""
        return "priority" if self is Tier.FAST else "default"


AUTO = "auto"

# OpenAI's `flex` (cheaper, slower) and `scale` (reserved capacity at default speed) have no
# pool of their own here: both are served by the standard tier's engines rather than
# refused, so that unmodified clients that send them keep working. `flex` is a lane of its
# own in admission (a capped, patient queue at the lowest urgency, refused with 429
# `resource_unavailable` when full) and is echoed `flex`, as OpenAI does.
_REQUESTED: dict[str, Tier | None] = {
    "auto": None,
    "default": Tier.STANDARD,
    "standard": Tier.STANDARD,
    "flex": Tier.STANDARD,
    "scale": Tier.STANDARD,
    "priority": Tier.FAST,
    "fast": Tier.FAST,
}

ACCEPTED_WORDS = tuple(_REQUESTED)

# How soon a request is served where requests of several kinds share a queue (the gateway's
# admission queue of a tier, and the engine's own with vLLM's priority scheduling): lower
# first. OpenAI's `priority` asks for lower latency on the same model; `flex` accepts
# slower service; an agent job's model calls (JOB_URGENCY) go last, whatever tier the job
# asked for, so that evaluation sweeps never slow interactive callers.
PRIORITY_URGENCY = 0
DEFAULT_URGENCY = 1
FLEX_URGENCY = 2
JOB_URGENCY = 2
_URGENCY = {"priority": PRIORITY_URGENCY, "fast": PRIORITY_URGENCY, "flex": FLEX_URGENCY}


FLEX = "flex"


def is_flex(word: str | None) -> bool:
    """Whether a requested tier word asks for the flex lane."""
    return (word or "").strip().lower() == FLEX


def served_word(tier: Tier, flex: bool) -> str:
    """The word echoed in an answer's ``service_tier``: ``flex`` for the flex lane, else the
    serving tier's OpenAI word."""
    return FLEX if flex else tier.openai_name


def urgency_of(word: str | None) -> int:
    """The urgency a requested tier word asks for (None, ``auto``: the default)."""
    return _URGENCY.get((word or "").strip().lower(), DEFAULT_URGENCY)


class UnknownTierError(ValueError):
    """A requested tier word that is neither OpenAI's nor tiergate's."""


def parse_requested_tier(word: str) -> Tier | None:
    """Map a requested tier word to a tier; ``None`` means "auto" (the policy decides)."""
    try:
        return _REQUESTED[word.strip().lower()]
    except KeyError:
        raise UnknownTierError(word) from None
