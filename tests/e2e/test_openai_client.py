"""End to end with the official ``openai`` client: gateway -> real vLLM-CPU, both tiers."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.e2e.conftest import MODEL, VllmServer
from tiergate.tiers import Tier

pytestmark = pytest.mark.e2e

PROMPT = [{"role": "user", "content": "Write a python function that adds two numbers."}]


@pytest.fixture
def client(gateway: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0, timeout=120)


def test_models_list_both_tiers(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].model_extra is not None
    assert models.data[0].model_extra["tiers"] == ["standard", "fast"]
    assert client.models.retrieve(MODEL).id == MODEL


@pytest.mark.parametrize(
    ("asked", "echoed", "served"),
    [
        (None, "default", "standard"),
        ("default", "default", "standard"),
        ("priority", "priority", "fast"),
        ("auto", "default", "standard"),
    ],
)
def test_chat_tier_by_field(
    client: openai.OpenAI, asked: str | None, echoed: str, served: str
) -> None:
    extra = {} if asked is None else {"service_tier": asked}
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=PROMPT,
        max_tokens=40,
        temperature=0,
        **extra,  # type: ignore[arg-type]
    )
    completion = raw.parse()
    assert completion.service_tier == echoed
    assert raw.headers["x-tiergate-tier"] == served
    assert "def " in (completion.choices[0].message.content or "")
    assert completion.usage is not None and completion.usage.completion_tokens > 0
    assert raw.headers["x-request-id"] and float(raw.headers["x-tiergate-overhead-ms"]) >= 0


def test_tier_by_header(client: openai.OpenAI) -> None:
    raw = client.completions.with_raw_response.create(
        model=MODEL,
        prompt="def add(a, b):",
        max_tokens=16,
        temperature=0,
        extra_headers={"X-Tiergate-Tier": "fast"},
    )
    assert raw.headers["x-tiergate-tier"] == "fast"
    assert raw.parse().model_extra is not None
    assert raw.parse().model_extra["service_tier"] == "priority"
    assert raw.parse().choices[0].text


def test_streaming_chat_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=PROMPT,
        max_tokens=24,
        temperature=0,
        stream=True,
        service_tier="priority",
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert {c.service_tier for c in chunks} == {"priority"}
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    # The usage counts what was generated: all 24 when the answer was cut at max_tokens,
    # fewer when the model ended it (a sampled answer ended at 21 once, in CI).
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    used = chunks[-1].usage.completion_tokens
    assert finish in (["length"], ["stop"]), finish
    assert used == 24 if finish == ["length"] else 0 < used < 24, (finish, used)


def test_streaming_completion_without_usage(client: openai.OpenAI) -> None:
    chunks = list(
        client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, stream=True)
    )
    assert all(c.usage is None for c in chunks)
    assert "".join(c.choices[0].text for c in chunks if c.choices)


def test_fields_pass_through_untouched(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL,
        messages=PROMPT,
        max_tokens=5,
        n=2,
        seed=7,
        logprobs=True,
        top_logprobs=2,
        stop=["\n\n"],
        temperature=0.8,
        service_tier="priority",
    )
    assert len(completion.choices) == 2
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None and logprobs.content
    assert len(logprobs.content[0].top_logprobs) == 2


def test_fast_tier_refusals_are_served_by_standard(
    client: openai.OpenAI, vllm_servers: dict[Tier, VllmServer]
) -> None:
    body = {"model": MODEL, "messages": PROMPT, "max_tokens": 8, "min_p": 0.1}
    # The rule is real: the fast engine itself refuses the request...
    direct = httpx.post(f"{vllm_servers[Tier.FAST].url}/v1/chat/completions", json=body)
    assert direct.status_code == 400
    # ...and through the gateway it succeeds on the standard tier, which says so.
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=PROMPT,
        max_tokens=8,
        service_tier="priority",
        extra_body={"min_p": 0.1, "logit_bias": {"1": 2}},
    )
    assert raw.parse().service_tier == "default"
    assert raw.headers["x-tiergate-tier-reason"] == "capability"


def test_bad_requests_get_the_openai_envelope(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="no-such-model", messages=PROMPT)
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as tier:
        client.chat.completions.create(model=MODEL, messages=PROMPT, service_tier="turbo")  # type: ignore[arg-type]
    assert tier.value.code == "invalid_service_tier"
    # vLLM's own validation error comes back in OpenAI's shape (no integer code).
    with pytest.raises(openai.BadRequestError) as vllm_err:
        client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=-1)
    body = vllm_err.value.body
    assert isinstance(body, dict) and body["type"] == "invalid_request_error"
    assert body["code"] is None or isinstance(body["code"], str)


def test_gateway_metrics_count_tiers(gateway: str, client: openai.OpenAI) -> None:
    client.chat.completions.create(
        model=MODEL, messages=PROMPT, max_tokens=4, service_tier="priority", stream=False
    )
    text = httpx.get(f"{gateway}/metrics").text
    assert (
        'tiergate_requests_total{model="SmolLM2-135M-Instruct",path="/v1/chat/completions"'
        ',status="200",tier="fast"}' in text
    )
    assert "tiergate_time_to_first_token_seconds_count" in text
    assert "tiergate_endpoint_healthy{endpoint=" in text
