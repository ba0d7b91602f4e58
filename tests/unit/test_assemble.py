"""Assembling vLLM's non-streamed answer from its stream's chunks."""

from __future__ import annotations

import importlib
from typing import Any

from tiergate.gateway.openai.assemble import AnswerAssembler, assembles

HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "m"}


def _chunk(*choices: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {**HEAD, "choices": list(choices), **extra}


def test_chat_answer_has_vllms_fields_in_order() -> None:
    a = AnswerAssembler(chat=True)
    a.feed(_chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}))
    lp = {"token": "Hi", "logprob": -0.1, "bytes": [72, 105], "top_logprobs": []}
    a.feed(_chunk({"index": 0, "delta": {"content": "Hi"}, "logprobs": {"content": [lp]}}))
    a.feed(_chunk({"index": 0, "delta": {"content": "!"}, "logprobs": {"content": [lp]}}))
    a.feed(_chunk({"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": None}))
    a.feed(_chunk(usage={"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}))
    out = a.answer()
    assert list(out) == [
        "id", "object", "created", "model", "choices", "service_tier", "system_fingerprint",
        "usage", "prompt_logprobs", "prompt_token_ids", "prompt_text", "kv_transfer_params",
        "ec_transfer_params", "metrics",
    ]  # fmt: skip
    assert out["id"] == "chatcmpl-1" and out["object"] == "chat.completion"
    (choice,) = out["choices"]
    assert list(choice) == [
        "index", "message", "logprobs", "finish_reason", "stop_reason", "token_ids",
        "routed_experts",
    ]  # fmt: skip
    assert choice["message"] == {
        "role": "assistant",
        "content": "Hi!",
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "reasoning": None,
    }
    assert choice["logprobs"] == {"content": [lp, lp]}
    assert choice["finish_reason"] == "stop"
    assert list(out["usage"]) == [
        "prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details",
        "completion_tokens_details",
    ]  # fmt: skip


def test_tool_calls_and_several_choices_are_folded() -> None:
    a = AnswerAssembler(chat=True)
    call = {"index": 0, "id": "call-1", "type": "function", "function": {"name": "f"}}
    a.feed(_chunk({"index": 0, "delta": {"role": "assistant", "tool_calls": [call]}}))
    more = {"index": 0, "function": {"arguments": '{"city": '}}
    a.feed(_chunk({"index": 0, "delta": {"tool_calls": [more]}}))
    rest = {"index": 0, "function": {"arguments": '"Paris"}'}}
    a.feed(_chunk({"index": 0, "delta": {"tool_calls": [rest]}, "finish_reason": "tool_calls"}))
    a.feed(_chunk({"index": 1, "delta": {"content": "other"}, "finish_reason": "length"}))
    first, second = a.answer()["choices"]
    message = first["message"]
    assert message["content"] is None
    assert message["tool_calls"] == [
        {
            "id": "call-1",
            "type": "function",
            "function": {"name": "f", "arguments": '{"city": "Paris"}'},
        }
    ]
    assert list(message)[-2:] == ["tool_calls", "reasoning"]
    assert first["finish_reason"] == "tool_calls"
    assert second["index"] == 1 and second["message"]["content"] == "other"
    assert "tool_calls" not in second["message"]


def test_completion_answer_and_logprobs() -> None:
    a = AnswerAssembler(chat=False)
    lp = {"text_offset": [0], "token_logprobs": [-0.5], "tokens": ["a"], "top_logprobs": [None]}
    a.feed(
        {
            **HEAD,
            "object": "text_completion",
            "choices": [{"index": 0, "text": "a", "logprobs": lp}],
        }
    )
    lp2 = {"text_offset": [1], "token_logprobs": [-0.2], "tokens": ["b"], "top_logprobs": [None]}
    a.feed(
        {**HEAD, "choices": [{"index": 0, "text": "b", "logprobs": lp2, "finish_reason": "length"}]}
    )
    out = a.answer()
    assert out["object"] == "text_completion"
    assert "prompt_logprobs" not in out and list(out)[-3:] == [
        "kv_transfer_params", "ec_transfer_params", "metrics",
    ]  # fmt: skip
    (choice,) = out["choices"]
    assert choice["text"] == "ab" and choice["finish_reason"] == "length"
    assert choice["logprobs"] == {
        "text_offset": [0, 1],
        "token_logprobs": [-0.5, -0.2],
        "tokens": ["a", "b"],
        "top_logprobs": [None, None],
    }
    assert list(choice) == [
        "index", "text", "logprobs", "finish_reason", "stop_reason", "token_ids",
        "prompt_logprobs", "prompt_token_ids", "routed_experts",
    ]  # fmt: skip


def test_requests_whose_answers_a_stream_lacks_are_sent_as_they_are() -> None:
    assert assembles({"model": "m", "messages": []})
    assert not assembles({"model": "m", "prompt": "x", "echo": True})
    assert not assembles({"model": "m", "prompt": "x", "prompt_logprobs": 1})
    assert not assembles({"model": "m", "stream_options": {"include_usage": True}})


def test_answers_equal_vllms_own_model_dump() -> None:
    """The assembled answers against what vLLM's own response models dump (its non-streamed
    routes answer ``model_dump()``), for the cases the e2e tests meet."""
    # Imported, not import-or-skipped: when vLLM moves these modules, this check must be
    # moved with them, not silently skipped (vLLM is a dependency of the suite).
    chat = importlib.import_module("vllm.entrypoints.openai.chat_completion.protocol")
    completion = importlib.import_module("vllm.entrypoints.openai.completion.protocol")
    base = importlib.import_module("vllm.entrypoints.generate.base.protocol")
    engine = importlib.import_module("vllm.entrypoints.serve.engine.protocol")
    usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    tail = _chunk(usage=usage, system_fingerprint="fp-1")
    meta = {"id": "chatcmpl-1", "created": 7, "model": "m", "system_fingerprint": "fp-1"}
    meta["usage"] = engine.UsageInfo(**usage)

    plain = AnswerAssembler(chat=True)
    plain.feed(_chunk({"index": 0, "delta": {"role": "assistant", "content": ""}}))
    plain.feed(_chunk({"index": 0, "delta": {"content": "Red."}, "finish_reason": "stop"}))
    plain.feed(tail)
    red = chat.ChatMessage(role="assistant", content="Red.")
    choice = chat.ChatCompletionResponseChoice(index=0, message=red, finish_reason="stop")
    expected = chat.ChatCompletionResponse(choices=[choice], **meta)
    assert plain.answer() == expected.model_dump()

    forced = AnswerAssembler(chat=True, forced_tools=True)
    forced.feed(_chunk({"index": 0, "delta": {"role": "assistant", "content": ""}}))
    call = {"id": "call-1", "type": "function", "index": 0}
    call["function"] = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    forced.feed(_chunk({"index": 0, "delta": {"tool_calls": [call]}}))
    forced.feed(_chunk({"index": 0, "delta": {}, "finish_reason": "tool_calls"}))
    forced.feed(tail)
    function = base.FunctionCall(name="get_weather", arguments='{"city": "Paris"}')
    message = chat.ChatMessage(
        role="assistant", content="", tool_calls=[base.ToolCall(id="call-1", function=function)]
    )
    expected.choices = [
        chat.ChatCompletionResponseChoice(index=0, message=message, finish_reason="tool_calls")
    ]
    assert forced.answer() == expected.model_dump()

    text = AnswerAssembler(chat=False)
    lp = {"text_offset": [0], "token_logprobs": [-0.5], "tokens": [" Red"], "top_logprobs": [{}]}
    text.feed(_chunk({"index": 0, "text": " Red", "logprobs": lp, "finish_reason": "length"}))
    text.feed(tail)
    logprobs = completion.CompletionLogProbs(**lp)
    text_choice = completion.CompletionResponseChoice(
        index=0, text=" Red", logprobs=logprobs, finish_reason="length"
    )
    expected_text = completion.CompletionResponse(choices=[text_choice], **meta)
    assert text.answer() == expected_text.model_dump()
