"""Constrained output, penalties, logit bias and logprobs on real llama.cpp: greedy output
with every drafter equals plain decoding (``none``) under the same settings, token for token;
every finished schema'd answer validates (``jsonschema``); the forced tokens are drafted.
The tiny model (SmolLM2-135M, drafting for itself) runs fast; the default pair once."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from edgespec.core.sampling import SamplingParams
from edgespec.errors import ConfigError

from .real_util import GREEDY, ids

pytestmark = pytest.mark.real

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "languages": {"type": "array", "items": {"type": "string", "maxLength": 12},
                      "maxItems": 3},
    },
    "required": ["name", "age", "languages"],
    "additionalProperties": False,
}
EXTRACT = ("Extract the person as JSON with name, age and languages: Alice Smith is 34 and "
           "writes Python, Rust and Go.")
ANSWER = 'root ::= ("yes" | "no") ", because " [a-z ]{1,40} "."'


def _same_for_every_drafter(engine, drafters, **kw):
    outs = {d: engine.complete(drafter=d, **kw) for d in drafters}
    plain = ids(outs["none"])
    for d, out in outs.items():
        assert ids(out) == plain, d
    return outs


def test_schema_greedy_equal_for_every_drafter_and_valid(tiny_engine):
    outs = _same_for_every_drafter(tiny_engine, ("none", "lookup", "model", "hybrid", "auto"),
                                   prompt=EXTRACT, json_schema=PERSON, max_tokens=120,
                                   sampling=GREEDY)
    for d, out in outs.items():
        assert out.finish_reason == "stop", d
        jsonschema.validate(json.loads(out.text), PERSON)
    forced = outs["lookup"].stats.by_drafter["forced"]
    assert forced.drafted > 0 and forced.accepted == forced.drafted
    assert "forced" not in outs["none"].stats.by_drafter


def test_sampled_schema_answers_validate(tiny_engine):
    for seed in range(3):
        out = tiny_engine.complete(EXTRACT, json_schema=PERSON, max_tokens=120,
                                   sampling=SamplingParams(temperature=0.8, seed=seed))
        assert out.finish_reason == "stop"
        jsonschema.validate(json.loads(out.text), PERSON)


def test_json_object_and_gbnf_grammar(tiny_engine):
    out = tiny_engine.complete("Describe a cat as JSON.", json_object=True, max_tokens=60,
                               sampling=GREEDY, drafter="lookup")
    if out.finish_reason == "stop":
        assert isinstance(json.loads(out.text), dict)
    else:  # cut by max_tokens: still a JSON object's beginning
        assert out.text.startswith("{")
    outs = _same_for_every_drafter(tiny_engine, ("none", "lookup", "model"),
                                   prompt="Is the sky blue? Answer and say why.",
                                   grammar=ANSWER, max_tokens=40, sampling=GREEDY)
    assert re.fullmatch(r"(yes|no), because [a-z ]{1,40}\.", outs["none"].text)


def test_penalties_and_bias_greedy_equal_for_every_drafter(tiny_engine):
    params = SamplingParams(temperature=0, repeat_penalty=1.2, presence_penalty=0.5,
                            frequency_penalty=0.3, penalty_last_n=32,
                            logit_bias={tiny_engine.target.tokenize(" the", add_special=False)[0]: -5})
    outs = _same_for_every_drafter(tiny_engine, ("none", "lookup", "model"),
                                   prompt="Once upon a time, there lived", chat=False,
                                   max_tokens=60, sampling=params)
    plain = tiny_engine.complete("Once upon a time, there lived", chat=False, max_tokens=60,
                                 sampling=GREEDY, drafter="none")
    assert ids(outs["none"]) != ids(plain)  # the settings changed the text


def test_logprobs_are_the_same_with_every_drafter(tiny_engine):
    outs = _same_for_every_drafter(tiny_engine, ("none", "lookup", "model"),
                                   prompt="Count: one, two, three, four,", chat=False,
                                   max_tokens=20, sampling=GREEDY, logprobs=3)
    base = [(t.logprob, t.top_logprobs) for t in outs["none"].tokens]
    for d, out in outs.items():
        assert [(t.logprob, t.top_logprobs) for t in out.tokens] == base, d
    for t in outs["none"].tokens:  # greedy, unshaped: the token is its row's most likely
        assert t.logprob <= 0 and t.top_logprobs[0] == (t.id, t.logprob)
        assert [lp for _, lp in t.top_logprobs] == sorted((lp for _, lp in t.top_logprobs),
                                                          reverse=True)


@pytest.mark.parametrize("kw, message", [
    ({"json_schema": {"type": "nonsense"}}, "bad JSON schema"),
    ({"json_schema": "{not json"}, "not valid JSON"),
    ({"grammar": 'root ::= "a" | b'}, "bad grammar"),
    ({"json_schema": PERSON, "grammar": ANSWER}, "one constraint"),
    ({"logprobs": 21}, "logprobs"),
    ({"sampling": SamplingParams(logit_bias={10**7: 1})}, "past the vocabulary"),
])
def test_bad_constraints_and_values_are_clear_errors(tiny_engine, kw, message):
    with pytest.raises(ConfigError, match=message):
        tiny_engine.complete("Hi", max_tokens=4, **kw)
    assert tiny_engine.complete("Hi", max_tokens=2).tokens  # nothing lost: it still answers


@pytest.mark.slow
def test_default_pair_schema_greedy_equal_for_every_drafter_and_valid(default_engine):
    outs = _same_for_every_drafter(default_engine, ("none", "lookup", "model", "auto"),
                                   prompt=EXTRACT, json_schema=PERSON, max_tokens=80,
                                   sampling=GREEDY)
    for d, out in outs.items():
        assert out.finish_reason == "stop", d
        jsonschema.validate(json.loads(out.text), PERSON)
    assert outs["auto"].stats.by_drafter["forced"].accepted > 0


def test_unread_rows_leave_the_read_rows_and_the_cache_as_they_were(tiny_engine):
    target = tiny_engine.target
    prompt = target.tokenize("The quick brown fox jumps over the lazy dog. " * 3)
    feed = target.tokenize(" The quick brown fox", add_special=False)
    n = len(feed)
    results = []
    for unread in ((), (0, 2)):
        target.sync(prompt[:-1])
        target.decode(prompt[len(target.tokens):], 0)
        rows = target.decode(feed, n, unread).copy()
        after = target.decode([feed[0]], 1).copy()  # the cache the call left
        results.append((rows, after))
    (full, after_full), (some, after_some) = results
    read = [i for i in range(n) if i not in (0, 2)]
    assert (full[read] == some[read]).all()
    assert (after_full == after_some).all()
