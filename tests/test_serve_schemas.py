"""Request parsing: JSON bodies to engine.stream arguments, and the errors bad bodies get."""

from __future__ import annotations

import json

import pytest

from edgespec.core.sampling import SamplingParams
from edgespec.runtime.constraint import Constraint
from edgespec.server.errors import APIError
from edgespec.server.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    Defaults,
    parse_body,
    to_generation,
)

DEFAULTS = Defaults(sampling=SamplingParams(temperature=0.5, top_k=40, seed=9), max_tokens=33)
HELLO = [{"role": "user", "content": "hello"}]


def completion(**body):
    return to_generation(parse_body(CompletionRequest, json.dumps(body).encode()), DEFAULTS)


def chat(**body):
    body.setdefault("messages", HELLO)
    return to_generation(parse_body(ChatCompletionRequest, json.dumps(body).encode()), DEFAULTS)


def error_of(func, **body) -> APIError:
    with pytest.raises(APIError) as info:
        func(**body)
    return info.value


def test_completion_fields_become_stream_arguments():
    gen = completion(model="anything", prompt="Once", max_tokens=7, temperature=0.9, top_p=0.8,
                     seed=4, stop=["\n"], top_k=5, min_p=0.1, drafter="lookup", draft_length=6,
                     stream=True, user="ignored", metadata={"x": 1})
    assert gen.prompt == "Once" and gen.stream and not gen.include_usage
    assert gen.kwargs == {
        "max_tokens": 7, "stop": ["\n"], "chat": False, "drafter": "lookup", "draft_length": 6,
        "sampling": SamplingParams(temperature=0.9, top_k=5, top_p=0.8, min_p=0.1, seed=4),
    }


def test_missing_fields_take_the_server_defaults():
    gen = completion(prompt=["one prompt in a list"], stop="END")
    assert gen.prompt == "one prompt in a list"
    assert gen.kwargs == {"max_tokens": 33, "sampling": DEFAULTS.sampling, "stop": ["END"],
                          "chat": False}


def test_chat_messages_roles_and_content_parts():
    gen = chat(messages=[
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "name": "bot"},
        {"role": "user", "content": "c"},
    ], max_completion_tokens=5, max_tokens=99, stream_options={"include_usage": True}, stream=True)
    assert gen.prompt == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "a\nb"},
                          {"role": "assistant", "content": ""}, {"role": "user", "content": "c"}]
    assert gen.kwargs["chat"] is True and gen.kwargs["max_tokens"] == 5 and gen.include_usage


@pytest.mark.parametrize("body", [b"", b"{not json", b"[1, 2]", b'"text"', b"null"])
def test_a_body_that_is_not_a_json_object_is_a_400(body):
    with pytest.raises(APIError) as info:
        parse_body(CompletionRequest, body)
    assert info.value.status == 400 and info.value.code == "invalid_json"


@pytest.mark.parametrize("body, param", [
    ({}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": "x", "max_tokens": "9"}, "max_tokens"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "seed": True}, "seed"),
    ({"prompt": "x", "stop": 3}, "stop"),
    ({"prompt": "x", "stream": "yes"}, "stream"),
])
def test_wrong_types_and_missing_fields_are_422_naming_the_field(body, param):
    with pytest.raises(APIError) as info:
        parse_body(CompletionRequest, json.dumps(body).encode())
    assert (info.value.status, info.value.param) == (422, param)
    assert info.value.message.startswith(param + ":")


def test_a_bad_message_names_its_index():
    with pytest.raises(APIError) as info:
        parse_body(ChatCompletionRequest, json.dumps({"messages": [{"role": "user"}, {"content": "x"}]}).encode())
    assert (info.value.status, info.value.param) == (422, "messages[1].role")


@pytest.mark.parametrize("body, param", [
    ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"min_p": 2.0}, "min_p"),
    ({"seed": -5}, "seed"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"stop": ["ok", ""]}, "stop"),
    ({"drafter": "magic"}, "drafter"),
    ({"draft_length": 1000}, "draft_length"),
    ({"n": 0}, "n"),
    ({"n": 17}, "n"),
    ({"logprobs": 21}, "logprobs"),
    ({"logprobs": -1}, "logprobs"),
    ({"echo": True}, "echo"),
    ({"best_of": 2}, "best_of"),
    ({"suffix": "end"}, "suffix"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"repeat_penalty": 0}, "repeat_penalty"),
    ({"repeat_last_n": -2}, "repeat_last_n"),
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"logit_bias": {"five": 1}}, "logit_bias"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}},
     "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "nope"}}}}}},
     "response_format"),
    ({"json_schema": {"type": "strange"}}, "json_schema"),
    ({"grammar": "root ::= missing"}, "grammar"),
    ({"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}}, "grammar"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": "   "}, "prompt"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"top_logprobs": 2}, "top_logprobs"),
])
def test_invalid_or_unsupported_values_are_400_naming_the_field(body, param):
    body.setdefault("prompt", "x")
    err = error_of(completion, **body)
    assert (err.status, err.param) == (400, param), err.message


def test_unsupported_options_at_their_neutral_values_are_accepted():
    gen = completion(prompt="x", n=1, echo=False, best_of=1, suffix="", functions=[],
                     response_format={"type": "text"})
    assert gen.prompt == "x" and gen.n == 1 and "constraint" not in gen.kwargs


def test_penalties_and_logit_bias_become_sampling_settings():
    gen = completion(prompt="x", presence_penalty=0.5, frequency_penalty=-0.25, repeat_penalty=1.1,
                     repeat_last_n=-1, logit_bias={"7": -100, "3": 2.5})
    assert gen.kwargs["sampling"] == SamplingParams(
        temperature=0.5, top_k=40, seed=9, presence_penalty=0.5, frequency_penalty=-0.25,
        repeat_penalty=1.1, penalty_last_n=-1, logit_bias={3: 2.5, 7: -100})


def test_bad_penalty_messages_use_the_request_names():
    err = error_of(completion, prompt="x", repeat_last_n=-5)
    assert err.param == "repeat_last_n" and err.message.startswith("repeat_last_n must be")
    err = error_of(completion, prompt="x", logit_bias={"12": 300})
    assert err.param == "logit_bias" and "logit_bias[12] must be in [-100, 100]" in err.message


def test_n_choices_take_consecutive_seeds():
    gen = completion(prompt="x", n=3, seed=10)
    assert gen.n == 3 and [gen.choice_kwargs(i)["sampling"].seed for i in range(3)] == [10, 11, 12]
    assert gen.choice_kwargs(2)["sampling"].temperature == 0.5
    unseeded = to_generation(parse_body(CompletionRequest, b'{"prompt": "x", "n": 2}'), Defaults())
    assert unseeded.choice_kwargs(1)["sampling"].seed is None


def test_logprobs_of_completions_and_chat():
    assert completion(prompt="x", logprobs=0).kwargs["logprobs"] == 0
    assert completion(prompt="x", logprobs=5).logprobs == 5
    assert "logprobs" not in completion(prompt="x").kwargs
    assert chat(logprobs=True).kwargs["logprobs"] == 0
    assert chat(logprobs=True, top_logprobs=20).kwargs["logprobs"] == 20
    assert "logprobs" not in chat(logprobs=False).kwargs
    err = error_of(chat, top_logprobs=2)
    assert err.param == "top_logprobs" and "needs logprobs" in err.message
    assert error_of(chat, logprobs=True, top_logprobs=21).param == "top_logprobs"
    with pytest.raises(APIError) as info:  # chat's logprobs is a boolean, completions' a count
        parse_body(ChatCompletionRequest, json.dumps({"messages": HELLO, "logprobs": 3}).encode())
    assert info.value.status == 422 and info.value.param == "logprobs"


SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


@pytest.mark.parametrize("body, constraint", [
    ({"response_format": {"type": "text"}}, None),
    ({"response_format": {"type": "json_object"}}, Constraint.json_object()),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA,
                                                                 "strict": True}}},
     Constraint.json_schema(SCHEMA)),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "anything"}}},
     Constraint.json_object()),
    ({"response_format": {"type": "json_object", "schema": SCHEMA}}, Constraint.json_schema(SCHEMA)),
    ({"json_schema": SCHEMA}, Constraint.json_schema(SCHEMA)),
    ({"grammar": 'root ::= "yes" | "no"'}, Constraint.grammar('root ::= "yes" | "no"')),
])
def test_response_format_json_schema_and_grammar_become_the_constraint(body, constraint):
    for gen in (chat(**body), completion(prompt="x", **body)):
        assert gen.kwargs.get("constraint") == constraint


def test_a_bad_schema_says_what_is_wrong():
    err = error_of(chat, response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "nope"}}}}})
    assert (err.status, err.param) == (400, "response_format")
    assert err.message.startswith("response_format.json_schema.schema: bad JSON schema")


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def test_tools_and_tool_choice_reach_the_engine():
    gen = chat(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    assert gen.kwargs["tools"] == [WEATHER] and gen.kwargs["tool_choice"] == "required"
    assert gen.tools and gen.single_call
    gen = chat(tools=[WEATHER], tool_choice="none")
    assert not gen.tools and gen.kwargs["tool_choice"] == "none"
    assert not chat().tools and "tools" not in chat().kwargs


@pytest.mark.parametrize("body, param, message", [
    ({"tools": [{"type": "function", "function": {"name": "get weather"}}]},
     "tools[0].function.name", "tools[0].function.name: must be 1 to 64"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type", "tools[0].type: only function tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "other"}}},
     "tool_choice", "tool_choice: the function 'other' is not among the tools"),
    ({"tools": [WEATHER], "tool_choice": "any"}, "tool_choice", "tool_choice: must be one of"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
     "tool_choice", "a tool_choice that requires a call cannot be combined"),
])
def test_bad_tools_are_400_naming_the_parameter(body, param, message):
    err = error_of(chat, **body)
    assert (err.status, err.param) == (400, param) and err.message.startswith(message), err.message


def test_tool_turns_reach_the_template_with_their_calls():
    gen = chat(messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    ], tools=[WEATHER])
    assert gen.prompt == [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "18 C, sunny", "tool_call_id": "call_1"},
    ]


@pytest.mark.parametrize("message, param", [
    ({"role": "assistant", "tool_calls": [{"type": "function", "function": {
        "name": "f", "arguments": "{not json"}}]}, "messages[0].tool_calls"),
    ({"role": "assistant", "tool_calls": [{"type": "function", "function": {
        "name": "f", "arguments": "[1]"}}]}, "messages[0].tool_calls"),
    ({"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]},
     "messages[0].tool_calls"),
])
def test_bad_past_calls_are_400(message, param):
    err = error_of(chat, messages=[message])
    assert (err.status, err.param) == (400, param), err.message


@pytest.mark.parametrize("messages, param", [
    ([], "messages"),
    ([{"role": "function", "content": "x"}], "messages[0].role"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}],
     "messages[0].content"),
])
def test_bad_chat_messages_are_400(messages, param):
    err = error_of(chat, messages=messages)
    assert (err.status, err.param) == (400, param), err.message


def test_error_body_is_openai_shaped():
    err = error_of(completion, prompt="x", echo=True)
    assert err.body() == {"error": {"message": "echo is not supported by edgespec",
                                    "type": "invalid_request_error", "param": "echo",
                                    "code": "unsupported_parameter"}}
