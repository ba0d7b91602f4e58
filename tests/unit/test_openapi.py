"""The OpenAPI description generated from typed models: a valid OpenAPI 3.1 document, every
route of ROUTES described, and real OpenAI (and vLLM) request shapes valid against it; what
the gateway refuses itself (no model, more output tokens than it allows, an unknown tier)
is described as refused."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI, Request
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from tiergate.gateway import openapi
from tiergate.gateway.openai.routes import ROUTES

LIMIT = 4096
DOC_URI = "urn:tiergate:openapi"


def _document() -> dict[str, Any]:
    """The description of every ROUTES route, as the gateway registers them."""
    app = FastAPI(title="tiergate", version="test")
    for route in ROUTES.values():

        async def endpoint(request: Request) -> None:
            return None

        app.post(route.path, tags=["openai"], **openapi.route_doc(route, LIMIT))(endpoint)
    schema = app.openapi()
    openapi.add_model_examples(schema, ["served-model"])
    return schema


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return _document()


def _pointer(*parts: str) -> str:
    return "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)


def _validator(document: dict[str, Any], pointer: str) -> Draft202012Validator:
    registry: Registry[Any] = Registry().with_resource(
        DOC_URI, Resource.from_contents(document, default_specification=DRAFT202012)
    )
    return Draft202012Validator({"$ref": f"{DOC_URI}#/{pointer}"}, registry=registry)


def _request_validator(document: dict[str, Any], path: str) -> Draft202012Validator:
    return _validator(
        document,
        _pointer("paths", path, "post", "requestBody", "content", "application/json", "schema"),
    )


def _response_validator(
    document: dict[str, Any], path: str, media: str = "application/json"
) -> Draft202012Validator:
    return _validator(
        document, _pointer("paths", path, "post", "responses", "200", "content", media, "schema")
    )


def _valid(document: dict[str, Any], path: str, body: dict[str, Any]) -> None:
    errors = [e.message for e in _request_validator(document, path).iter_errors(body)]
    assert not errors, (path, body, errors[:3])


def _refused(document: dict[str, Any], path: str, body: dict[str, Any]) -> None:
    assert not _request_validator(document, path).is_valid(body), (path, body)


def test_the_description_is_valid_openapi_3_1(document: dict[str, Any]) -> None:
    assert document["openapi"].startswith("3.1")
    validate(document)


def test_every_route_is_described_and_every_reference_resolves(document: dict[str, Any]) -> None:
    assert set(ROUTES) <= set(document["paths"])
    components = document["components"]["schemas"]
    refs = [node["$ref"] for node in openapi._walk(document) if isinstance(node.get("$ref"), str)]
    assert refs
    for ref in refs:
        assert ref.startswith("#/components/schemas/"), ref
        assert ref.removeprefix("#/components/schemas/") in components, ref
    assert "$defs" not in str(document)
    for path, route in ROUTES.items():
        operation = document["paths"][path]["post"]
        assert operation["summary"] == route.summary
        assert operation["requestBody"]["required"] is True
        statuses = set(operation["responses"])
        assert {"200", "400", "401", "404", "429", "502", "503"} <= statuses, path
        content = operation["responses"]["200"]["content"]
        assert ("text/event-stream" in content) == route.streams, path


def test_generation_happens_once() -> None:
    assert openapi._generated() is openapi._generated()
    route = ROUTES["/v1/chat/completions"]
    # Each call is a fresh copy: the app may change it without touching the cache.
    first = openapi.route_doc(route, LIMIT)
    first["openapi_extra"]["requestBody"]["content"].clear()
    assert openapi.route_doc(route, LIMIT)["openapi_extra"]["requestBody"]["content"]


def test_served_models_are_the_model_examples(document: dict[str, Any]) -> None:
    for path in ROUTES:
        body = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        for obj in openapi._objects(body["schema"]):
            assert obj["properties"]["model"]["examples"] == ["served-model"], path


def _chat(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": list(messages), **fields}


CHAT_REQUESTS: dict[str, dict[str, Any]] = {
    "roles": _chat(
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": "Answer in French."},
        {"role": "user", "content": "Hi", "name": "ann"},
        {"role": "assistant", "content": "Salut"},
    ),
    "content parts": _chat(
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in this image?"},
                {
                    "type": "image_url",
                    "image_url": {"url": "https://example.com/cat.png", "detail": "low"},
                },
            ],
        },
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
    ),
    "tool calls and a tool message": _chat(
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
        tools=[
            {
                "type": "function",
                "function": {
                    "name": "weather",
                    "description": "Current weather",
                    "parameters": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}},
                        "required": ["city"],
                    },
                },
            }
        ],
        tool_choice={"type": "function", "function": {"name": "weather"}},
        parallel_tool_calls=False,
    ),
    "tool_choice words": _chat({"role": "user", "content": "x"}, tool_choice="required"),
    "json schema response format": _chat(
        {"role": "user", "content": "A person"},
        response_format={
            "type": "json_schema",
            "json_schema": {
                "name": "person",
                "strict": True,
                "schema": {"type": "object", "properties": {"name": {"type": "string"}}},
            },
        },
    ),
    "json object response format": _chat(
        {"role": "user", "content": "x"}, response_format={"type": "json_object"}
    ),
    "sampling and streaming options": _chat(
        {"role": "user", "content": "x"},
        temperature=0.2,
        top_p=0.9,
        n=2,
        stop=["\n", "END"],
        seed=7,
        logprobs=True,
        top_logprobs=3,
        logit_bias={"50256": -100},
        max_tokens=LIMIT,
        max_completion_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
        user="u1",
    ),
    "nulls where OpenAI allows them": _chat(
        {"role": "user", "content": "x"},
        stream=None,
        max_tokens=None,
        temperature=None,
        service_tier=None,
        stop=None,
    ),
    "vLLM's extra sampling fields pass": _chat(
        {"role": "user", "content": "x"}, top_k=5, min_p=0.1, repetition_penalty=1.1
    ),
}


@pytest.mark.parametrize("body", CHAT_REQUESTS.values(), ids=list(CHAT_REQUESTS))
def test_openai_chat_requests_are_valid(document: dict[str, Any], body: dict[str, Any]) -> None:
    _valid(document, "/v1/chat/completions", body)


@pytest.mark.parametrize(
    "tier", ["auto", "default", "flex", "scale", "priority", "standard", "fast"]
)
def test_service_tier_takes_openai_and_tiergate_words(document: dict[str, Any], tier: str) -> None:
    _valid(
        document, "/v1/chat/completions", _chat({"role": "user", "content": "x"}, service_tier=tier)
    )
    _valid(document, "/v1/embeddings", {"model": "m", "input": "x", "service_tier": tier})


@pytest.mark.parametrize("prompt", ["Say hi", ["one", "two"], [1, 2, 3], [[1, 2], [3]]], ids=str)
def test_completions_prompt_shapes_are_valid(document: dict[str, Any], prompt: Any) -> None:
    _valid(
        document,
        "/v1/completions",
        {
            "model": "m",
            "prompt": prompt,
            "max_tokens": 8,
            "echo": True,
            "logprobs": 2,
            "stream": False,
        },
    )


RESPONSES_INPUTS: dict[str, Any] = {
    "text": "Tell me a joke",
    "items": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "What is this?"},
                {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "auto"},
            ],
        },
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "weather",
            "arguments": '{"city": "Paris"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
    ],
}


@pytest.mark.parametrize("value", RESPONSES_INPUTS.values(), ids=list(RESPONSES_INPUTS))
def test_responses_input_shapes_are_valid(document: dict[str, Any], value: Any) -> None:
    _valid(
        document,
        "/v1/responses",
        {
            "model": "m",
            "input": value,
            "instructions": "Be kind.",
            "max_output_tokens": 64,
            "tools": [
                {
                    "type": "function",
                    "name": "weather",
                    "parameters": {"type": "object", "properties": {}},
                    "strict": False,
                }
            ],
            "tool_choice": "auto",
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
            "reasoning": {"effort": "low"},
            "stream": True,
            "store": False,
        },
    )


@pytest.mark.parametrize("value", ["one", ["one", "two"], [1, 2], [[1, 2], [3]]], ids=str)
def test_embeddings_input_shapes_are_valid(document: dict[str, Any], value: Any) -> None:
    _valid(
        document,
        "/v1/embeddings",
        {"model": "m", "input": value, "encoding_format": "float", "dimensions": 8},
    )


VLLM_REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("/tokenize", {"model": "m", "prompt": "Hello", "add_special_tokens": False}),
    (
        "/tokenize",
        {
            "model": "m",
            "messages": [{"role": "user", "content": "Hello"}],
            "add_generation_prompt": True,
            "return_token_strs": True,
        },
    ),
    ("/detokenize", {"model": "m", "tokens": [1, 2, 3]}),
    ("/pooling", {"model": "m", "input": ["a", "b"], "task": "embed", "encoding_format": "float"}),
    ("/pooling", {"model": "m", "messages": [{"role": "user", "content": "x"}]}),
    ("/classify", {"model": "m", "input": "I loved it"}),
    ("/classify", {"model": "m", "input": [[1, 2, 3]], "truncate_prompt_tokens": -1}),
    ("/score", {"model": "m", "queries": "capital of France", "documents": ["Paris", "Rome"]}),
    ("/score", {"model": "m", "text_1": "a", "text_2": ["b", "c"]}),
    ("/v1/score", {"model": "m", "data_1": "a", "data_2": "b"}),
    (
        "/score",
        {
            "model": "m",
            "queries": "a cat",
            "documents": {
                "content": [
                    {"type": "image_url", "image_url": {"url": "https://example.com/c.png"}},
                    {"type": "text", "text": "a cat"},
                ]
            },
        },
    ),
    ("/rerank", {"model": "m", "query": "q", "documents": ["a", "b"], "top_n": 1}),
    ("/v1/rerank", {"model": "m", "query": "q", "documents": ["a"]}),
    ("/v2/rerank", {"model": "m", "query": "q", "documents": ["a"], "max_tokens_per_doc": 64}),
]


@pytest.mark.parametrize(("path", "body"), VLLM_REQUESTS, ids=[p for p, _ in VLLM_REQUESTS])
def test_vllm_request_shapes_are_valid(
    document: dict[str, Any], path: str, body: dict[str, Any]
) -> None:
    _valid(document, path, body)


def test_what_the_gateway_refuses_is_described_as_refused(document: dict[str, Any]) -> None:
    user = {"role": "user", "content": "x"}
    _refused(document, "/v1/chat/completions", {"messages": [user]})
    _refused(document, "/v1/chat/completions", _chat(user, model=""))
    _refused(document, "/v1/chat/completions", _chat(user, max_tokens=LIMIT + 1))
    _refused(document, "/v1/chat/completions", _chat(user, max_completion_tokens=LIMIT + 1))
    _refused(document, "/v1/chat/completions", _chat(user, service_tier="turbo"))
    _refused(document, "/v1/chat/completions", _chat(user, stream="yes"))
    # Nested shapes are checked too (the references into the components resolve).
    _refused(document, "/v1/chat/completions", _chat({"role": "robot", "content": "x"}))
    _refused(document, "/v1/chat/completions", _chat({"role": "tool", "content": "x"}))
    _refused(
        document,
        "/v1/chat/completions",
        _chat({"role": "user", "content": [{"type": "hologram", "hologram": "x"}]}),
    )
    _refused(document, "/v1/completions", {"model": "m", "prompt": "x", "max_tokens": LIMIT + 1})
    _refused(document, "/v1/responses", {"input": "x"})
    _refused(
        document, "/v1/responses", {"model": "m", "input": "x", "max_output_tokens": LIMIT + 1}
    )
    _refused(document, "/tokenize", {"prompt": "x"})
    _refused(
        document,
        "/tokenize",
        {
            "model": "m",
            "messages": [user],
            "add_generation_prompt": True,
            "continue_final_message": True,
        },
    )
    _refused(document, "/detokenize", {"model": "m", "tokens": [-1]})
    _refused(document, "/rerank", {"model": "m", "documents": ["a"]})


def test_openai_and_vllm_answers_match_the_response_schemas(document: dict[str, Any]) -> None:
    chat = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "hi",
                    "refusal": None,
                    "annotations": None,
                    "audio": None,
                    "function_call": None,
                    "tool_calls": [],
                    "reasoning_content": None,
                },
                "logprobs": None,
                "finish_reason": "stop",
                "stop_reason": None,
            }
        ],
        "service_tier": "priority",
        "system_fingerprint": None,
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        "prompt_logprobs": None,
    }
    assert _response_validator(document, "/v1/chat/completions").is_valid(chat)
    chunk = (
        '{"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": []}'
    )
    events = _response_validator(document, "/v1/chat/completions", "text/event-stream")
    assert events.is_valid({"data": chunk})
    assert events.is_valid({"data": "[DONE]"})
    rerank = {
        "id": "rerank-1",
        "model": "m",
        "usage": {"prompt_tokens": 4, "total_tokens": 4},
        "results": [{"index": 0, "document": {"text": "a"}, "relevance_score": 0.9}],
    }
    assert _response_validator(document, "/rerank").is_valid(rerank)
    tokens = {"count": 2, "max_model_len": 2048, "tokens": [1, 2]}
    assert _response_validator(document, "/tokenize").is_valid(tokens)
    assert not _response_validator(document, "/tokenize").is_valid({"count": 2})


def test_shortened_component_names_stay_unique() -> None:
    names = [
        "Reasoning",
        "openai__types__shared__reasoning__Reasoning",
        "openai__types__shared_params__reasoning__Reasoning",
        "openai__types__chat__chat_completion__Choice",
        "openai__types__chat__chat_completion_chunk__Choice",
    ]
    renamed = openapi._short_names(names)
    assert len(set(renamed.values())) == len(names)
    assert renamed["openai__types__chat__chat_completion__Choice"] == "ChatCompletionChoice"
    assert renamed["Reasoning"] == "Reasoning"


def test_the_gateway_serves_the_generated_description() -> None:
    from tiergate.gateway.app import create_app
    from tiergate.settings import load_settings

    settings = load_settings(gateway={"max_tokens_limit": 1000})
    schema = create_app(settings).openapi()
    validate(schema)
    assert set(ROUTES) <= set(schema["paths"])
    _valid(schema, "/v1/chat/completions", _chat({"role": "user", "content": "x"}, max_tokens=1000))
    _refused(
        schema, "/v1/chat/completions", _chat({"role": "user", "content": "x"}, max_tokens=1001)
    )
