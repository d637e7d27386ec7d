"""Tool calls (edgespec.runtime.tools): checking tools, the template's family, reading calls
whole and streamed (every split of the text gives the same calls), and the constraint for
``required`` and a named function, compiled and matched on the default target's vocabulary."""

from __future__ import annotations

import json
import random

import pytest

from edgespec.errors import ConfigError
from edgespec.runtime.constraint import Matcher, check
from edgespec.runtime.tools import (
    ToolCallStream,
    check_tools,
    merge_events,
    parse_tool_calls,
    tool_constraint,
    tool_family,
)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"enum": ["C", "F"]}},
                   "required": ["city", "unit"]}}}
NOW = {"type": "function", "function": {"name": "now"}}
TOOLS = [WEATHER, NOW]

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n</tool_call>'
CALL_ARGS = '{"city": "Paris", "unit": "C"}'


def streamed(text: str, family: str, cuts: list[int]) -> list[dict]:
    """The deltas of ``text`` fed in pieces cut at ``cuts``."""
    stream = ToolCallStream(family)
    events, last = [], 0
    for cut in [*cuts, len(text)]:
        events += stream.feed(text[last:cut])
        last = cut
    return events + stream.finish()


def without_ids(calls: list[dict]) -> list[tuple[str, str]]:
    return [(c["function"]["name"], c["function"]["arguments"]) for c in calls]


# ---- checking ---------------------------------------------------------------------------------

@pytest.mark.parametrize("tools, choice, message", [
    ("get_weather", None, "tools: must be a list"),
    ([{"type": "code_interpreter"}], None, "tools[0].type: only function tools"),
    ([{"type": "function"}], None, "tools[0].function: must be an object"),
    ([{"type": "function", "function": {"name": "get weather"}}], None, "tools[0].function.name"),
    ([WEATHER, WEATHER], None, "tools[1].function.name: 'get_weather' names two tools"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}], None,
     'tools[0].function.parameters: the arguments are a JSON object, so the schema\'s type must be "object"'),
    ([{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "strng"}}}}}], None,
     "tools[0].function.parameters: bad JSON schema"),
    ([{"type": "function", "function": {"name": "f", "parameters": []}}], None,
     "tools[0].function.parameters: must be a JSON schema object"),
    (TOOLS, "always", "tool_choice: must be one of 'auto', 'none', 'required'"),
    (TOOLS, {"type": "function", "function": {"name": "nope"}},
     "tool_choice: the function 'nope' is not among the tools (get_weather, now)"),
    (TOOLS, {"type": "function"}, "tool_choice: a named choice is"),
    (None, "required", "tool_choice: 'required' needs tools"),
    ([], {"type": "function", "function": {"name": "now"}}, "tool_choice: the function 'now' needs tools"),
])
def test_check_tools_names_what_is_wrong(tools, choice, message):
    with pytest.raises(ConfigError) as err:
        check_tools(tools, choice)
    assert str(err.value).startswith(message)


@pytest.mark.parametrize("choice", [None, "auto", "none", "required",
                                    {"type": "function", "function": {"name": "now"}}])
def test_check_tools_accepts_openai_shapes(choice):
    check_tools(TOOLS, choice)
    check_tools([{"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
        "additionalProperties": False}}}], "auto")


def test_tool_family_from_the_template():
    assert tool_family("{%- if tools %}...<tool_call>\\n{{...}}</tool_call>{% endif %}") == "hermes"
    assert tool_family("<|start_header_id|>ipython<|end_header_id|> {% if tools %}"
                       "<|python_tag|>{% endif %}") == "llama3"
    assert tool_family("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}") == "none"
    assert tool_family(None) == "none"


# ---- reading calls --------------------------------------------------------------------------

def test_hermes_calls_with_content_before_them():
    text = f"Let me check.\n{CALL}\n" + CALL.replace("Paris", "Oslo")
    content, calls = parse_tool_calls(text, "hermes")
    assert content == "Let me check."
    assert without_ids(calls) == [("get_weather", CALL_ARGS), ("get_weather", CALL_ARGS.replace("Paris", "Oslo"))]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)
    assert len({c["id"] for c in calls}) == 2
    assert all(json.loads(c["function"]["arguments"]) for c in calls)


def test_only_calls_have_no_content():
    assert parse_tool_calls(CALL, "hermes")[0] is None
    assert parse_tool_calls(CALL + "\n", "hermes")[0] is None


@pytest.mark.parametrize("text", [
    "Plain text, nothing to call.\n\n",
    "  a <tool_ that is not a tag <tool_cal",
    "<tool_call>\nnot json at all\n</tool_call> after",
    '<tool_call>\n{"name": "f", "argu',  # cut off before its arguments: text
    "",
])
def test_text_without_calls_comes_back_as_it_is(text):
    assert parse_tool_calls(text, "hermes") == (text, [])
    for cuts in ([], list(range(1, len(text))), [len(text) // 2]):
        assert merge_events(streamed(text, "hermes", cuts)) == (text, [])


@pytest.mark.parametrize("text, content", [
    ('```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n```', None),
    ('Sure:\n```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```\nDone.', "Sure:\nDone."),
    ('{"name": "get_weather", "arguments": {"city": "Paris"}}', None),
    ('\n{"name": "get_weather", "arguments": {"city": "Paris"}}\nThat is all.', "That is all."),
])
def test_calls_in_a_code_fence_or_as_the_whole_answer(text, content):
    got, calls = parse_tool_calls(text, "hermes")
    assert got == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize("text", [
    '```json\n{"answer": 42}\n```',
    '```python\nprint(1)\n```\nDone.\n```\nplain\n```',
    '{"answer": 42}',
    'Call it: {"name": "get_weather", "arguments": {"city": "Paris"}}',  # not the answer's start
])
def test_fences_and_objects_that_are_not_calls_stay_content(text):
    assert parse_tool_calls(text, "hermes") == (text, [])
    assert merge_events(streamed(text, "hermes", list(range(1, len(text))))) == (text, [])


def test_a_call_written_in_another_order_is_read_whole():
    text = '<tool_call>\n{"arguments": {"x": 1}, "name": "f"}\n</tool_call>'
    assert without_ids(parse_tool_calls(text, "hermes")[1]) == [("f", '{"x": 1}')]
    # arguments given as JSON text
    text = '<tool_call>\n{"name": "f", "arguments": "{\\"x\\": 1}"}\n</tool_call>'
    assert without_ids(parse_tool_calls(text, "hermes")[1]) == [("f", '{"x": 1}')]


def test_llama3_calls():
    one = '{"name": "get_weather", "parameters": ' + CALL_ARGS + "}"
    for text in (one, "<|python_tag|>" + one, "\n " + one):
        content, calls = parse_tool_calls(text, "llama3")
        assert content is None and without_ids(calls) == [("get_weather", CALL_ARGS)]
    content, calls = parse_tool_calls(one + "; " + one.replace("Paris", "Rome"), "llama3")
    assert [json.loads(c["function"]["arguments"])["city"] for c in calls] == ["Paris", "Rome"]
    for text in ('{"answer": 42}', "The weather is fine.", '{"name": 3, "parameters": {}}'):
        assert parse_tool_calls(text, "llama3") == (text, [])


def test_family_none_reads_no_calls():
    assert parse_tool_calls(CALL, "none") == (CALL, [])


@pytest.mark.parametrize("family, text", [
    ("hermes", f"I will call two tools.\n\n{CALL}\n{CALL.replace('Paris', 'Lima')}\n"),
    ("hermes", 'Sure <tool_call>\n{"name": "now", "arguments": {}}\n</tool_call> and then more text'),
    ("hermes", '<tool_call>\n{"arguments": {"x": "y"}, "name": "f"}\n</tool_call>'),
    ("hermes", 'Sure:\n```json\n{"name": "f", "arguments": {"a": [1, 2]}}\n```\nDone, see ```code```.'),
    ("hermes", '  {"name": "f", "arguments": {"a": "{"}}  \n\nafter'),
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {"s": "a \\" } ] \\\\", "b": [{"c": {}}]}}\n</tool_call>'),
    ("llama3", '<|python_tag|>{"name": "f", "parameters": {"s": "}"}};{"name": "g", "parameters": {}}'),
    ("llama3", '{"parameters": {"a": 1}, "name": "f"}'),
])
def test_streaming_in_any_pieces_gives_the_whole_reading(family, text):
    whole_content, whole_calls = parse_tool_calls(text, family)
    assert whole_calls
    rng = random.Random(5)
    for trial in range(40):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, min(12, len(text) - 1))))
        if trial == 0:
            cuts = list(range(1, len(text)))  # a character at a time
        events = streamed(text, family, cuts)
        content, calls = merge_events(events)
        assert content == whole_content and without_ids(calls) == without_ids(whole_calls)
        for event in events:  # OpenAI's delta shapes
            assert set(event) in ({"content"}, {"tool_calls"})
            for delta in event.get("tool_calls", ()):
                if "id" in delta:
                    assert delta["type"] == "function" and "name" in delta["function"]
                else:
                    assert set(delta) == {"index", "function"} and set(delta["function"]) == {"arguments"}


FRAGMENTS = ["<tool_call>", "</tool_call>", "<tool", "```json\n", "```\n", "```", "{", "}", "[", "\n",
             "  ", '"name"', '"arguments"', '"parameters"', ": ", ", ", '"f"', '"a \\" {"', "1", ";",
             "<|python_tag|>", "Hello", " world.", '{"name": "f", "arguments": {"x": 1}}',
             '{"name": "g", "parameters": {}}', '<tool_call>\n{"name": "f", "arguments": {"y": [2]}}\n</tool_call>']


@pytest.mark.parametrize("family", ["hermes", "llama3"])
def test_any_text_streams_to_its_whole_reading(family):
    """Random texts made of the parsers' delimiters: streamed in random pieces they read as
    they do whole, and a text without calls is its own content."""
    rng = random.Random(11)
    for _ in range(400):
        text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 10)))
        whole = parse_tool_calls(text, family)
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 8))))
        content, calls = merge_events(streamed(text, family, cuts))
        assert (content, without_ids(calls)) == (whole[0], without_ids(whole[1])), text
        if not calls:
            assert content == text
        for call in calls:
            assert call["function"]["name"] in ("f", "g")


def test_stream_announces_a_call_before_its_end_and_streams_its_arguments():
    stream = ToolCallStream("hermes")
    assert stream.feed("Checking.\n<tool") == [{"content": "Checking."}]  # the tag is held back
    assert stream.feed('_call>\n{"name": "get_wea') == []
    first = stream.feed('ther", "arguments": {"ci')
    assert first == [{"tool_calls": [{"index": 0, "id": first[0]["tool_calls"][0]["id"],
                                      "type": "function",
                                      "function": {"name": "get_weather", "arguments": '{"ci'}}]}]
    assert stream.feed('ty": "Paris"') == [{"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Paris"'}}]}]
    assert stream.feed('}}\n</tool_call>') == [{"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}]
    assert stream.finish() == []


def test_a_call_cut_off_keeps_what_it_streamed():
    text = '<tool_call>\n{"name": "f", "arguments": {"a": "par'
    content, calls = parse_tool_calls(text, "hermes")
    assert content is None and without_ids(calls) == [("f", '{"a": "par')]


# ---- constraints ------------------------------------------------------------------------------

def test_constraint_only_where_a_call_is_required():
    for choice in (None, "auto", "none"):
        assert tool_constraint(TOOLS, choice, "hermes") is None
    for family in ("hermes", "llama3"):
        for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
            constraint = tool_constraint(TOOLS, choice, family)
            assert constraint.kind == "lark"
            check(constraint)  # compiles


def test_constraint_needs_a_known_format():
    with pytest.raises(ConfigError, match="tools: this model's chat template has no tool-call format"):
        tool_constraint(TOOLS, "required", "none")
    assert tool_constraint(None, None, "none") is None
    assert tool_constraint(TOOLS, "none", "none") is None  # not used: no format needed


def _matcher(tokenizer, n_vocab, choice, family="hermes", **kw):
    return Matcher(tool_constraint(TOOLS, choice, family, tokenizer=tokenizer, **kw), tokenizer, n_vocab)


@pytest.mark.real
def test_constraint_on_the_default_targets_vocabulary(default_engine):
    target = default_engine.target
    tokenizer = target.constraint_tokenizer
    ids = target.tokenize(CALL, add_special=False)
    assert ids[0] == 151657 and ids[-1] == 151658  # <tool_call> and </tool_call>: one token each
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in ("required", named):
        for by in (tokenizer, None):  # the tag as the special token's id, or by its name
            matcher = Matcher(tool_constraint(TOOLS, choice, "hermes", tokenizer=by), tokenizer,
                              target.n_vocab)
            assert matcher.forced()[:1] == [151657]
            assert matcher.valid(ids) == len(ids)
            matcher.push(ids)
            assert matcher.allowed()[151645]  # then the end (<|im_end|>)
    # a second call only where several are allowed
    matcher = _matcher(tokenizer, target.n_vocab, named)
    two = target.tokenize(CALL + "\n" + CALL, add_special=False)
    assert matcher.valid(two) == len(ids)
    assert _matcher(tokenizer, target.n_vocab, "required").valid(two) == len(two)
    # arguments outside the schema are refused
    bad = target.tokenize(CALL.replace('"C"', '"K"'), add_special=False)
    assert _matcher(tokenizer, target.n_vocab, "required").valid(bad) < len(bad)


@pytest.mark.real
def test_the_default_target_makes_a_named_call_greedily(default_engine):
    """The constraint on the real model: a parsable call whose arguments fit the schema."""
    import jsonschema

    from edgespec.core.sampling import SamplingParams

    target = default_engine.target
    assert tool_family(target.metadata()["tokenizer.chat_template"]) == "hermes"
    ask = [{"role": "user", "content": "What is the weather in Paris right now, in Celsius?"}]
    done = default_engine.complete(ask, tools=TOOLS, max_tokens=32,
                                   tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                   sampling=SamplingParams(temperature=0))
    assert done.text.startswith("<tool_call>\n{") and done.text.endswith("</tool_call>")
    content, calls = parse_tool_calls(done.text, "hermes")
    assert content is None and [c["function"]["name"] for c in calls] == ["get_weather"]
    arguments = json.loads(calls[0]["function"]["arguments"])
    jsonschema.validate(arguments, WEATHER["function"]["parameters"])
    assert arguments["city"] == "Paris"
