from __future__ import annotations

import orjson
import pytest

from tiergate.gateway.errors import OpenAIError, from_upstream
from tiergate.gateway.selection import fast_compatible, inspect, upstream_body
from tiergate.tiers import Tier, UnknownTierError, parse_requested_tier


@pytest.mark.parametrize(
    ("word", "tier"),
    [
        ("priority", Tier.FAST),
        ("fast", Tier.FAST),
        ("default", Tier.STANDARD),
        ("standard", Tier.STANDARD),
        ("flex", Tier.STANDARD),
        ("auto", None),
        (" FAST ", Tier.FAST),
    ],
)
def test_tier_words(word: str, tier: Tier | None) -> None:
    assert parse_requested_tier(word) is tier


def test_unknown_tier_word() -> None:
    with pytest.raises(UnknownTierError):
        parse_requested_tier("turbo")


def _inspect(body: dict[str, object], header: str | None = None) -> tuple[Tier, str]:
    req = inspect(orjson.dumps(body), header, Tier.STANDARD, 64)
    return req.choice.tier, req.choice.reason


def test_field_header_and_policy() -> None:
    assert _inspect({"model": "m"}) == (Tier.STANDARD, "auto")
    assert _inspect({"model": "m", "service_tier": "priority"}) == (Tier.FAST, "requested")
    assert _inspect({"model": "m"}, "fast") == (Tier.FAST, "header")
    assert _inspect({"model": "m", "service_tier": "auto"}, "fast") == (Tier.FAST, "header")
    # The field wins over the header.
    assert _inspect({"model": "m", "service_tier": "default"}, "fast") == (
        Tier.STANDARD,
        "requested",
    )


@pytest.mark.parametrize(
    "extra",
    [{"min_p": 0.1}, {"logit_bias": {"12": 5}}, {"logits_processors": ["x"]}],
)
def test_fast_refused_features_go_to_standard(extra: dict[str, object]) -> None:
    assert not fast_compatible(extra)
    assert _inspect({"model": "m", "service_tier": "priority", **extra}) == (
        Tier.STANDARD,
        "capability",
    )


@pytest.mark.parametrize("extra", [{"min_p": 0}, {"min_p": None}, {"logit_bias": {}}, {}])
def test_harmless_values_stay_fast(extra: dict[str, object]) -> None:
    assert fast_compatible(extra)


def test_upstream_body_drops_tier_and_asks_usage() -> None:
    req = inspect(
        orjson.dumps(
            {
                "model": "m",
                "service_tier": "fast",
                "stream": True,
                "seed": 3,
                "tools": [{"type": "function"}],
            }
        ),
        None,
        Tier.STANDARD,
        64,
    )
    sent = orjson.loads(upstream_body(req))
    assert sent == {
        "model": "m",
        "stream": True,
        "seed": 3,
        "tools": [{"type": "function"}],
        "stream_options": {"include_usage": True},
    }
    assert not req.wants_usage


def test_prefix_key_shared_by_same_leading_prompt() -> None:
    a = inspect(orjson.dumps({"model": "m", "prompt": "s" * 100 + "A"}), None, Tier.STANDARD, 64)
    b = inspect(orjson.dumps({"model": "m", "prompt": "s" * 100 + "B"}), None, Tier.STANDARD, 64)
    c = inspect(orjson.dumps({"model": "m", "prompt": "t" * 100}), None, Tier.STANDARD, 64)
    assert a.prefix_key == b.prefix_key != c.prefix_key


def test_vllm_error_is_normalised() -> None:
    err = from_upstream(
        400,
        b'{"error": {"message": "bad", "type": "BadRequestError", '
        b'"param": "max_tokens", "code": 400}}',
    )
    assert err.envelope() == {
        "error": {
            "message": "bad",
            "type": "invalid_request_error",
            "param": "max_tokens",
            "code": None,
        }
    }
    old = from_upstream(
        404,
        b'{"object": "error", "message": "The model x does not exist",'
        b' "type": "NotFoundError", "code": 404}',
    )
    assert old.envelope()["error"]["code"] == "model_not_found"
    assert from_upstream(502, b"<html>bad gateway</html>").message.startswith("<html>")


def test_error_types_follow_status() -> None:
    assert OpenAIError(429, "x").type == "rate_limit_error"
    assert OpenAIError(503, "x").type == "server_error"
