"""Request parsing: JSON bodies to engine.stream arguments, and the errors bad bodies get."""

from __future__ import annotations

import json

import pytest

from edgespec.core.sampling import SamplingParams
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
    ({"n": 2}, "n"),
    ({"logprobs": 3}, "logprobs"),
    ({"echo": True}, "echo"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"logit_bias": {"5": 1}}, "logit_bias"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": "   "}, "prompt"),
])
def test_invalid_or_unsupported_values_are_400_naming_the_field(body, param):
    body.setdefault("prompt", "x")
    err = error_of(completion, **body)
    assert (err.status, err.param) == (400, param), err.message


def test_unsupported_options_at_their_neutral_values_are_accepted():
    gen = completion(prompt="x", n=1, echo=False, frequency_penalty=0, presence_penalty=0.0,
                     logit_bias={}, logprobs=None, response_format={"type": "text"})
    assert gen.prompt == "x"


@pytest.mark.parametrize("messages, param", [
    ([], "messages"),
    ([{"role": "tool", "content": "x"}], "messages[0].role"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}],
     "messages[0].content"),
])
def test_bad_chat_messages_are_400(messages, param):
    err = error_of(chat, messages=messages)
    assert (err.status, err.param) == (400, param), err.message


def test_error_body_is_openai_shaped():
    err = error_of(completion, prompt="x", n=3)
    assert err.body() == {"error": {"message": "n is not supported by edgespec",
                                    "type": "invalid_request_error", "param": "n",
                                    "code": "unsupported_parameter"}}
