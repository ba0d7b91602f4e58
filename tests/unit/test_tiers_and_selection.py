from __future__ import annotations

import orjson
import pytest

from tiergate.gateway.access.auth import ANONYMOUS
from tiergate.gateway.access.policy import TierPolicy
from tiergate.gateway.errors import OpenAIError, from_upstream
from tiergate.gateway.openai.routes import ROUTES, echo_tier
from tiergate.gateway.openai.selection import (
    fast_compatible,
    inspect,
    requested_tier,
    upstream_body,
)
from tiergate.settings import PolicySettings
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
    """The tier and reason the policy decides for a body (auto: standard, no limits)."""
    req = inspect(orjson.dumps(body), header, 64)
    policy = TierPolicy(PolicySettings(), lambda: True, lambda tier, path: None)
    decision = policy.decide(ANONYMOUS, req.asked, req.needs)
    return decision.tier, decision.reason.value


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
    a = inspect(orjson.dumps({"model": "m", "prompt": "s" * 100 + "A"}), None, 64)
    b = inspect(orjson.dumps({"model": "m", "prompt": "s" * 100 + "B"}), None, 64)
    c = inspect(orjson.dumps({"model": "m", "prompt": "t" * 100}), None, 64)
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


def test_each_route_reads_its_own_prompt_and_output_limit() -> None:
    responses = ROUTES["/v1/responses"]
    req = inspect(
        orjson.dumps({"model": "m", "instructions": "be brief", "input": "hello", "stream": True}),
        None,
        64,
        route=responses,
    )
    assert req.prompt_chars == len("be brief") + len("hello") and req.stream
    # The Responses API asks for no stream usage (its terminal event carries it).
    assert "stream_options" not in orjson.loads(upstream_body(req))
    with pytest.raises(OpenAIError) as err:
        inspect(orjson.dumps({"model": "m", "max_output_tokens": 99}), None, 64, 10, responses)
    assert err.value.param == "max_output_tokens"
    # A route that cannot stream ignores the field (vLLM answers for it).
    emb = inspect(
        orjson.dumps({"model": "m", "input": ["ab", "cd"], "stream": "x"}),
        None,
        64,
        route=ROUTES["/v1/embeddings"],
    )
    assert not emb.stream and emb.prompt_chars == 4 and emb.fast_compatible
    # `stream: null` is valid OpenAI (not streaming).
    assert not inspect(orjson.dumps({"model": "m", "stream": None}), None, 64).stream


def test_one_reading_of_the_asked_tier_for_requests_and_jobs() -> None:
    """The body's word wins over the header, ``auto`` asks for none, and a word that is no
    tier is the same 400 wherever it is said (the jobs API reads it through this too)."""
    assert requested_tier("priority").tier is Tier.FAST
    assert requested_tier("auto", "fast").tier is Tier.FAST  # auto defers to the header
    assert requested_tier("default", "fast").tier is Tier.STANDARD
    assert requested_tier(None).tier is None and requested_tier("auto").tier is None
    for word, header in (("turbo", None), (None, "turbo"), (3, None)):
        with pytest.raises(OpenAIError) as refused:
            requested_tier(word, header)
        assert refused.value.status == 400


def test_the_served_tier_is_echoed_as_openai_names_it() -> None:
    answer: dict[str, object] = {"service_tier": "auto"}
    echo_tier(answer, Tier.FAST)
    assert answer == {"service_tier": "priority"}
    echo_tier(answer, Tier.STANDARD)
    assert answer == {"service_tier": "default"}
