"""Structured requests over the HTTP server with the official openai client, on fakes: tool
calls (whole and streamed as OpenAI's deltas), log-probabilities in chat's and completions'
shapes, ``n`` choices, logit bias and penalties, and what reaches the engine."""

from __future__ import annotations

import json

import openai
import pytest

from .fakes import ScriptedEngine
from .serve_util import fake_engine, running_server

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
ASK = [{"role": "user", "content": "Weather in Paris and Oslo?"}]

#: a Qwen-style answer: a sentence, then two calls, in the pieces a model's rounds give
CALLS = ["I'll check", " both.", "\n", "<tool_call>", "\n", '{"name": "get_weather", ',
         '"arguments": {"city": ', '"Paris"}}', "\n", "</tool_call>", "\n", "<tool_call>",
         '\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n', "</tool_call>"]


def client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.v1, api_key="none", max_retries=0, timeout=20)


@pytest.fixture(scope="module")
def tooled():
    engine = ScriptedEngine(CALLS)
    with running_server(engine) as served:
        served.engine = engine
        yield served


@pytest.fixture(scope="module")
def served():
    with running_server(fake_engine()) as s:
        yield s


def joined_tool_calls(chunks) -> tuple[str, list[dict]]:
    """Content and calls put back together from stream chunks, as OpenAI's docs do it."""
    content, calls = "", []
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            for call in delta.tool_calls or ():
                if call.index == len(calls):
                    assert call.id.startswith("call_") and call.type == "function"
                    assert call.function.name and call.function.arguments is not None
                    calls.append({"id": call.id, "name": call.function.name, "arguments": ""})
                else:
                    assert call.id is None and call.function.name is None
                calls[call.index]["arguments"] += call.function.arguments or ""
    return content, calls


def test_tool_calls_in_a_whole_answer(tooled):
    answer = client(tooled).chat.completions.create(model="x", messages=ASK, tools=[WEATHER])
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "I'll check both."
    calls = choice.message.tool_calls
    assert [json.loads(c.function.arguments) for c in calls] == [{"city": "Paris"}, {"city": "Oslo"}]
    assert all(c.type == "function" and c.function.name == "get_weather" for c in calls)
    assert all(c.id.startswith("call_") for c in calls) and calls[0].id != calls[1].id
    prompt, kwargs = tooled.engine.calls[-1]
    assert prompt == ASK and kwargs["tools"] == [WEATHER] and "tool_choice" not in kwargs


def test_tool_calls_streamed_as_openai_deltas(tooled):
    api = client(tooled)
    chunks = list(api.chat.completions.create(model="x", messages=ASK, tools=[WEATHER],
                                              tool_choice="auto", stream=True))
    content, calls = joined_tool_calls(chunks)
    assert content == "I'll check both."
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"})]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert chunks[-1].model_extra["edgespec"]["finish_reason"] == "stop"
    # the first call is announced before its end, its arguments streamed in pieces
    pieces = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices[0].delta.tool_calls]
    assert pieces[0].function.arguments == '{"city": ' and pieces[1].function.arguments == '"Paris"}'
    # no content delta carries any of the call's text
    assert all("tool_call" not in (c.choices[0].delta.content or "") for c in chunks)


def test_one_call_where_parallel_calls_are_off(tooled):
    api = client(tooled)
    answer = api.chat.completions.create(model="x", messages=ASK, tools=[WEATHER],
                                         parallel_tool_calls=False)
    assert len(answer.choices[0].message.tool_calls) == 1
    chunks = api.chat.completions.create(model="x", messages=ASK, tools=[WEATHER],
                                         parallel_tool_calls=False, stream=True)
    assert [c["arguments"] for c in joined_tool_calls(chunks)[1]] == ['{"city": "Paris"}']


def test_tool_choice_none_leaves_the_text_alone(tooled):
    answer = client(tooled).chat.completions.create(model="x", messages=ASK, tools=[WEATHER],
                                                    tool_choice="none")
    assert answer.choices[0].message.content == "".join(CALLS)
    assert answer.choices[0].message.tool_calls is None
    assert answer.choices[0].finish_reason == "stop"


def test_a_conversation_with_tool_results_reaches_the_engine(tooled):
    history = [*ASK,
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_a", "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
               {"role": "tool", "tool_call_id": "call_a", "content": "18 C"}]
    client(tooled).chat.completions.create(model="x", messages=history, tools=[WEATHER],
                                           tool_choice={"type": "function",
                                                        "function": {"name": "get_weather"}})
    prompt, kwargs = tooled.engine.calls[-1]
    assert prompt[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert prompt[2] == {"role": "tool", "content": "18 C", "tool_call_id": "call_a"}
    assert kwargs["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}


def test_structured_options_reach_the_engine(tooled):
    from edgespec.runtime.constraint import Constraint

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    client(tooled).chat.completions.create(
        model="x", messages=ASK, response_format={
            "type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": True}})
    assert tooled.engine.calls[-1][1]["constraint"] == Constraint.json_schema(schema)


@pytest.mark.parametrize("kwargs, param, words", [
    (dict(tools=[{"type": "function", "function": {"name": "two words"}}]),
     "tools[0].function.name", "must be 1 to 64"),
    (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}),
     "tool_choice", "'nope' is not among the tools"),
    (dict(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "integr"}}}}}),
     "response_format", "bad JSON schema"),
    (dict(logprobs=False, top_logprobs=3), "top_logprobs", "needs logprobs"),
    (dict(n=0), "n", "n must be"),
    (dict(extra_body={"repeat_penalty": -1}), "repeat_penalty", "repeat_penalty must be"),
])
def test_bad_structured_requests_are_400_naming_the_parameter(tooled, kwargs, param, words):
    with pytest.raises(openai.BadRequestError) as err:
        client(tooled).chat.completions.create(model="x", messages=ASK, **kwargs)
    body = err.value.body
    assert body["param"] == param and words in body["message"], body


# ---- log-probabilities --------------------------------------------------------------------------

def test_chat_logprobs_whole_and_streamed(tooled):
    api = client(tooled)
    answer = api.chat.completions.create(model="x", messages=ASK, logprobs=True, top_logprobs=2)
    content = answer.choices[0].logprobs.content
    assert [t.token for t in content] == CALLS
    assert [t.logprob for t in content] == pytest.approx([-0.1 * (i + 1) for i in range(len(CALLS))])
    assert content[0].bytes == list(CALLS[0].encode())
    assert [t.token for t in content[0].top_logprobs] == CALLS[:2]
    assert content[0].top_logprobs[1].bytes == list(CALLS[1].encode())
    chunks = list(api.chat.completions.create(model="x", messages=ASK, logprobs=True,
                                              top_logprobs=2, stream=True))
    streamed = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [t.model_dump() for t in streamed] == [t.model_dump() for t in content]
    # each content chunk carries its own token's
    for c in chunks:
        if c.choices[0].delta.content:
            assert [t.token for t in c.choices[0].logprobs.content] == [c.choices[0].delta.content]


def test_chat_logprobs_with_tool_calls_ride_on_the_chunks_sent(tooled):
    chunks = list(client(tooled).chat.completions.create(
        model="x", messages=ASK, tools=[WEATHER], logprobs=True, stream=True))
    streamed = [t.token for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert streamed == CALLS
    assert all(not t.top_logprobs for c in chunks if c.choices[0].logprobs
               for t in c.choices[0].logprobs.content)  # top_logprobs 0: none


def test_completions_logprobs_in_the_legacy_shape(tooled):
    api = client(tooled)
    out = api.completions.create(model="x", prompt="Weather?", logprobs=1)
    lp = out.choices[0].logprobs
    assert lp.tokens == CALLS and lp.token_logprobs[0] == pytest.approx(-0.1)
    assert lp.top_logprobs[0] == {CALLS[0]: pytest.approx(-0.1)}  # the top one is the chosen one
    assert lp.top_logprobs[1] == {CALLS[1]: pytest.approx(-0.2)}
    offsets = [sum(len(p) for p in CALLS[:i]) for i in range(len(CALLS))]
    assert lp.text_offset == offsets
    chunks = list(api.completions.create(model="x", prompt="Weather?", logprobs=1, stream=True))
    assert [o for c in chunks if c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset] == offsets


def test_logprobs_from_the_engine_over_a_fake_model(served):
    api = client(served)
    answer = api.chat.completions.create(model="x", messages=ASK, max_tokens=8, temperature=0,
                                         logprobs=True, top_logprobs=3)
    content = answer.choices[0].logprobs.content
    assert "".join(t.token for t in content) == answer.choices[0].message.content
    for t in content:
        tops = [x.logprob for x in t.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and tops[0] <= 0
        assert t.token == t.top_logprobs[0].token and t.logprob == pytest.approx(tops[0])  # greedy
    chunks = list(api.chat.completions.create(model="x", messages=ASK, max_tokens=8, temperature=0,
                                              logprobs=True, top_logprobs=3, stream=True))
    streamed = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [t.model_dump() for t in streamed] == [t.model_dump() for t in content]


# ---- n choices, bias and penalties --------------------------------------------------------------

def test_n_choices_one_after_another_with_consecutive_seeds(served):
    api = client(served)
    sampling = dict(temperature=0.9, seed=21, max_tokens=10)
    out = api.completions.create(model="x", prompt="Once", n=3, **sampling)
    assert [c.index for c in out.choices] == [0, 1, 2]
    for i, choice in enumerate(out.choices):
        alone = api.completions.create(model="x", prompt="Once", **{**sampling, "seed": 21 + i})
        assert choice.text == alone.choices[0].text
    assert out.usage.completion_tokens == 30
    assert len(out.model_extra["edgespec"]["choices"]) == 3
    chunks = list(api.completions.create(model="x", prompt="Once", n=3, stream=True,
                                         stream_options={"include_usage": True}, **sampling))
    order = [c.choices[0].index for c in chunks if c.choices]
    assert order == sorted(order)  # each choice's chunks in turn
    for i, choice in enumerate(out.choices):
        assert "".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == i) == choice.text
    assert chunks[-1].usage.completion_tokens == 30
    chat = api.chat.completions.create(model="x", messages=ASK, n=2, **sampling)
    assert [c.index for c in chat.choices] == [0, 1]
    assert chat.choices[0].message.content != chat.choices[1].message.content


def test_logit_bias_and_penalties_change_the_answer(served):
    api = client(served)
    greedy = api.completions.create(model="x", prompt="Once", max_tokens=6, temperature=0).choices[0].text
    first = ord(greedy[0]) - 33  # the fake's token i is the character chr(33 + i)
    banned = api.completions.create(model="x", prompt="Once", max_tokens=6, temperature=0,
                                    logit_bias={str(first): -100}).choices[0].text
    assert banned[0] != greedy[0]
    forced = api.completions.create(model="x", prompt="Once", max_tokens=6, temperature=0,
                                    logit_bias={"5": 100}).choices[0].text
    assert forced == chr(33 + 5) * 6
    repeated = api.completions.create(model="x", prompt="Once", max_tokens=6, temperature=0,
                                      logit_bias={"5": 100}, frequency_penalty=2,
                                      extra_body={"repeat_penalty": 1.5, "repeat_last_n": -1})
    assert repeated.choices[0].text == forced  # a bias of 100 outweighs them
    with pytest.raises(openai.BadRequestError) as err:
        api.completions.create(model="x", prompt="Once", logit_bias={"4000": 1})
    assert err.value.body["param"] == "logit_bias" and "past the vocabulary" in err.value.body["message"]
