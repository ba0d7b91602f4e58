"""The OpenAI surface beyond chat, with the official ``openai`` client against the real
vLLM tiers of this session: the Responses API (plain and streamed), a full tool-call round
trip and a JSON-schema answer on each tier, embeddings (a clear error: the served model is
generative), tokenize/detokenize, and model cards that say what each tier runs. Then the
README's examples of these routes, verbatim."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai import OpenAI

from tests.e2e.conftest import MODEL
from tests.readme_blocks import run_readme_block

pytestmark = pytest.mark.e2e

TIERS = [("default", "standard"), ("priority", "fast")]

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        # strict: the arguments are held to the schema (vLLM constrains the decoding).
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def _client(gateway: str) -> OpenAI:
    return OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0, timeout=180)


@pytest.mark.parametrize(("service_tier", "tier"), TIERS)
def test_responses_plain_and_streamed(gateway: str, service_tier: str, tier: str) -> None:
    client = _client(gateway)
    raw = client.responses.with_raw_response.create(
        model=MODEL, input="Say hello.", max_output_tokens=12, service_tier=service_tier
    )
    assert raw.headers["x-tiergate-tier"] == tier
    response = raw.parse()
    assert response.service_tier == service_tier
    assert response.output_text and response.usage is not None
    assert response.status in ("completed", "incomplete")

    events = list(
        client.responses.create(
            model=MODEL,
            input="Count to three.",
            max_output_tokens=12,
            service_tier=service_tier,
            stream=True,
        )
    )
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created", kinds
    assert kinds[-1] in ("response.completed", "response.incomplete"), kinds
    final = events[-1].response  # type: ignore[union-attr]
    assert final.service_tier == service_tier
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas and deltas == final.output_text


@pytest.mark.parametrize(("service_tier", "tier"), TIERS)
def test_tool_call_round_trip(gateway: str, service_tier: str, tier: str) -> None:
    client = _client(gateway)
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=messages,
        tools=[WEATHER_TOOL],
        tool_choice="required",
        service_tier=service_tier,
        max_tokens=60,
        temperature=0,
    )
    assert raw.headers["x-tiergate-tier"] == tier
    first = raw.parse().choices[0]
    assert first.finish_reason == "tool_calls", first
    (call,) = first.message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, WEATHER_TOOL["function"]["parameters"])

    messages.append(first.message.model_dump(exclude_none=True))
    messages.append(
        {
            "role": "tool",
            "tool_call_id": call.id,
            "content": json.dumps({"city": arguments["city"], "temperature_c": 21}),
        }
    )
    final = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=[WEATHER_TOOL],
        tool_choice="none",
        service_tier=service_tier,
        max_tokens=40,
        temperature=0,
    )
    answer = final.choices[0]
    assert answer.finish_reason in ("stop", "length")
    assert answer.message.content and not answer.message.tool_calls
    assert final.service_tier == service_tier


@pytest.mark.parametrize(("service_tier", "tier"), TIERS)
def test_json_schema_answer(gateway: str, service_tier: str, tier: str) -> None:
    raw = _client(gateway).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Invent a person."}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON, "strict": True},
        },
        service_tier=service_tier,
        max_tokens=60,
        temperature=0,
    )
    assert raw.headers["x-tiergate-tier"] == tier
    jsonschema.validate(json.loads(raw.parse().choices[0].message.content or ""), PERSON)


def test_embeddings_are_a_clear_error_for_a_generative_model(gateway: str) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        _client(gateway).embeddings.create(model=MODEL, input="hello")
    body = err.value.body
    assert isinstance(body, dict) and body["code"] == "route_not_served"
    assert "/v1/embeddings" in body["message"] and "pooling model" in body["message"]


@pytest.mark.parametrize(("service_tier", "tier"), TIERS)
def test_tokenize_detokenize_round_trip(gateway: str, service_tier: str, tier: str) -> None:
    text = "Tiers serve the same model."
    tokens = httpx.post(
        f"{gateway}/tokenize",
        json={"model": MODEL, "prompt": text, "service_tier": service_tier},
        timeout=60,
    )
    assert tokens.status_code == 200, tokens.text
    assert tokens.headers["x-tiergate-tier"] == tier
    ids = tokens.json()["tokens"]
    assert tokens.json()["count"] == len(ids) > 3
    back = httpx.post(
        f"{gateway}/detokenize",
        json={"model": MODEL, "tokens": ids, "service_tier": service_tier},
        timeout=60,
    )
    assert back.status_code == 200 and back.json()["prompt"] == text


def test_model_cards_say_what_each_tier_runs(gateway: str) -> None:
    (card,) = [m for m in _client(gateway).models.list().data if m.id == MODEL]
    extra = card.model_extra or {}
    assert sorted(extra["tiers"]) == ["fast", "standard"]
    details = {d["tier"]: d for d in extra["tier_details"]}
    assert details["standard"]["service_tier"] == "default"
    assert details["fast"]["service_tier"] == "priority" and details["fast"]["runs"]


@pytest.mark.parametrize("block", ["routes-responses", "routes-tools", "routes-tokenize"])
def test_readme_route_examples_run(gateway: str, tmp_path: Path, block: str) -> None:
    done = run_readme_block(block, gateway, tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip(), done.stderr


def test_the_readmes_first_calls_run(gateway: str, tmp_path: Path) -> None:
    """The README's first screen, verbatim: the curl call, the openai client's call and
    stream, and the tiers' description."""
    curl = run_readme_block("first-curl", gateway, tmp_path, timeout=600)
    assert curl.returncode == 0, curl.stderr
    answer = json.loads(curl.stdout)
    assert answer["service_tier"] == "priority" and answer["choices"][0]["message"]["content"]
    client = run_readme_block("first-openai", gateway, tmp_path, timeout=600)
    assert client.returncode == 0, client.stderr
    first, *chunks = client.stdout.splitlines()
    assert first.startswith("priority ")
    assert chunks and "usage=CompletionUsage" in chunks[-1], chunks[-3:]
    tiers = run_readme_block("tiers", gateway, tmp_path, timeout=60)
    assert tiers.returncode == 0, tiers.stderr
    assert {"standard", "fast"} <= {t["tier"] for t in json.loads(tiers.stdout)["data"]}
