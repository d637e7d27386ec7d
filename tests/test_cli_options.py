"""The command line's constrained output, penalties, logit bias and log-probabilities
(edgespec/cli/options.py and the faces that take them: complete, chat, serve, verify).

Fast tests run the commands in-process over fake engines; a constraint given to a fake engine
is :class:`tests.fakes.FakeMatcher`. The tests marked ``real`` run ``edgespec`` on the tiny
SmolLM2-135M model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from edgespec.cli.main import cli
from edgespec.cli.options import make_constraint, parse_logit_bias
from edgespec.errors import ConfigError
from edgespec.runtime import engine as engine_module
from edgespec.runtime.constraint import Constraint

from .fakes import FakeMatcher

YES_NO = 'root ::= ("yes" | "no" | "maybe") ", because " [a-z ]+\n'
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 16},
                         "age": {"type": "integer", "minimum": 0, "maximum": 130}}}


@pytest.fixture
def fake_grammar(monkeypatch):
    """Any constraint an engine over fakes is given is a :class:`FakeMatcher`."""
    monkeypatch.setattr(engine_module, "Matcher",
                        lambda constraint, tokenizer, n_vocab: FakeMatcher(n_vocab, 5))


def constrainable(engine):
    """A fake engine whose target offers a (stand-in) constraint tokenizer."""
    engine.target.constraint_tokenizer = None
    return engine


def recording(engine, calls: list, method: str = "stream"):
    """Record the keyword arguments of each ``engine.<method>`` call, then make it."""
    real = getattr(engine, method)

    def wrapper(prompt, **kwargs):
        calls.append(kwargs)
        return real(prompt, **kwargs)

    setattr(engine, method, wrapper)
    return engine


def one_error_line(res, code: int = 2) -> str:
    assert res.exit_code == code, (res.exit_code, res.output)
    assert "Traceback" not in res.output and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return lines[0]


# ---- options ----------------------------------------------------------------------------------


def test_logit_bias_values():
    assert parse_logit_bias(["13=-100", " 7 = 2.5"]) == {13: -100.0, 7: 2.5}
    assert parse_logit_bias([]) == {}
    for bad in ("13", "x=1", "-3=1", "13=much", "=1"):
        with pytest.raises(ConfigError, match="--logit-bias takes TOKEN=BIAS"):
            parse_logit_bias([bad])
    with pytest.raises(ConfigError, match="names token 4 twice"):
        parse_logit_bias(["4=1", "4=2"])


def test_constraints_from_files_and_inline_text(tmp_path):
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    grammar = tmp_path / "yes.gbnf"
    grammar.write_text(YES_NO)
    none = dict(schema=None, json_object=False, grammar=None)
    assert make_constraint(none) is None
    for given in (str(schema), json.dumps(PERSON), "  " + json.dumps(PERSON)):
        c = make_constraint(dict(none, schema=given))
        assert c.kind == "json_schema" and c.schema == PERSON
    assert make_constraint(dict(none, json_object=True)) == Constraint.json_object()
    assert make_constraint(dict(none, grammar=str(grammar))) == Constraint.grammar(YES_NO)
    assert make_constraint(dict(none, grammar=YES_NO)) == Constraint.grammar(YES_NO)


# (arguments, what the one error line must hold); a file name "@NAME" is made in tmp_path
BAD = [
    (["--schema", "no-such.json"], "--schema: no such file 'no-such.json'"),
    (["--schema", "{not json"], "--schema: the schema given is not valid JSON"),
    (["--schema", "@list.json"], "--schema: a JSON schema is a JSON object"),
    (["--schema", "@broken.json"], "is not valid JSON: Expecting"),
    (["--schema", "@"], "is a directory"),
    (["--schema", '{"type": "objectx"}'], "--schema: bad JSON schema: Invalid type: objectx"),
    (["--grammar", "no-such.gbnf"], "--grammar: no such file 'no-such.gbnf'"),
    (["--grammar", "@empty.gbnf"], "--grammar: "),
    (["--grammar", "root ::= foo"], "--grammar: bad grammar: "),
    (["--json-object", "--grammar", "root ::= \"a\""],
     "give one of --schema, --json-object and --grammar, not --json-object and --grammar"),
    (["--presence-penalty", "3"], "presence_penalty must be in [-2, 2]"),
    (["--frequency-penalty", "nan"], "frequency_penalty must be in [-2, 2]"),
    (["--repeat-penalty", "0"], "repeat_penalty must be a number > 0"),
    (["--repeat-last-n", "-2"], "--repeat-last-n must be an integer >= -1"),
    (["--logit-bias", "x=1"], "--logit-bias takes TOKEN=BIAS"),
    (["--logit-bias", "5=200"], "logit_bias[5] must be in [-100, 100]"),
]
PENALTIES_ONLY = [case for case in BAD if not case[0][0].startswith(("--schema", "--grammar",
                                                                     "--json-object"))]


def _files(tmp_path: Path, args: list[str]) -> list[str]:
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "broken.json").write_text('{"type": ')
    (tmp_path / "empty.gbnf").write_text("\n")
    return [str(tmp_path / a[1:]) if a.startswith("@") else a for a in args]


@pytest.fixture
def no_loading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the options were checked")

    for where in ("edgespec.cli.options", "edgespec.cli.main", "edgespec.cli.serve"):
        monkeypatch.setattr(f"{where}.load_engine", refuse)
    monkeypatch.setattr("tui.app.ChatApp", refuse)


@pytest.mark.parametrize("command", ["complete", "chat", "verify"])
@pytest.mark.parametrize("args, message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_values_are_one_error_line_before_loading(command, args, message, tmp_path,
                                                      monkeypatch, no_loading):
    monkeypatch.chdir(tmp_path)
    head = ["complete", "hi"] if command == "complete" else [command]
    res = CliRunner().invoke(cli, [*head, "--pair", "tiny", *_files(tmp_path, args)])
    assert message in one_error_line(res)


@pytest.mark.parametrize("args, message", PENALTIES_ONLY,
                         ids=[" ".join(a) for a, _ in PENALTIES_ONLY])
def test_serve_refuses_bad_penalties_before_loading(args, message, no_loading):
    res = CliRunner().invoke(cli, ["serve", "--pair", "tiny", "--port", "0", *args])
    assert message in one_error_line(res)


def test_logprobs_range():
    res = CliRunner().invoke(cli, ["complete", "hi", "--logprobs", "21"])
    assert res.exit_code == 2 and "0<=x<=20" in res.stderr


# ---- complete ---------------------------------------------------------------------------------


def _fake_complete(monkeypatch, calls: list):
    from .test_engine_fake import HELLO, build

    engine = recording(constrainable(build(HELLO * 3, drafter="none", draft=None)), calls)
    monkeypatch.setattr("edgespec.cli.main.load_engine", lambda opts, progress=True: engine)
    return engine


def test_complete_gives_the_engine_penalties_bias_constraint_and_logprobs(monkeypatch,
                                                                          fake_grammar):
    calls: list = []
    _fake_complete(monkeypatch, calls)
    res = CliRunner().invoke(cli, [
        "complete", "hi", "--raw", "--json", "-n", "6", "--schema", json.dumps(PERSON),
        "--presence-penalty", "0.5", "--frequency-penalty", "-0.25", "--repeat-penalty", "1.1",
        "--repeat-last-n", "-1", "--logit-bias", "3=-5", "--logit-bias", "2=1.5",
        "--logprobs", "2"])
    assert res.exit_code == 0, res.output
    [kw] = calls
    s = kw["sampling"]
    assert (s.presence_penalty, s.frequency_penalty, s.repeat_penalty, s.penalty_last_n) == (
        0.5, -0.25, 1.1, -1)
    assert s.logit_bias == ((2, 1.5), (3, -5.0))
    assert kw["constraint"] == Constraint.json_schema(PERSON) and kw["logprobs"] == 2
    out = json.loads(res.stdout)
    assert len(out["logprobs"]) == out["tokens"] > 0
    assert "".join(e["token"] for e in out["logprobs"]) == out["text"]
    for e in out["logprobs"]:
        assert e["logprob"] <= 0 and len(e["top_logprobs"]) == 2
        top = e["top_logprobs"]
        assert top[0]["logprob"] >= top[1]["logprob"] and {"id", "token"} <= set(top[0])


def test_complete_without_options_asks_for_nothing_new(monkeypatch):
    calls: list = []
    _fake_complete(monkeypatch, calls)
    res = CliRunner().invoke(cli, ["complete", "hi", "--raw", "--json", "-n", "4"])
    assert res.exit_code == 0, res.output
    [kw] = calls
    assert kw["constraint"] is None and kw["logprobs"] is None and not kw["sampling"].shaped
    assert "logprobs" not in json.loads(res.stdout)


def test_complete_logprobs_without_json_is_a_table_on_stderr(monkeypatch):
    _fake_complete(monkeypatch, [])
    res = CliRunner().invoke(cli, ["complete", "hi", "--raw", "-n", "5", "--logprobs", "1"])
    assert res.exit_code == 0, res.output
    assert res.stdout == "hello \n"  # h, e, l, lo, space
    header, *rows = res.stderr.splitlines()
    assert header.split() == ["token", "logprob", "alternatives"] and len(rows) == 5
    assert rows[0].split()[0] == "'h'" and float(rows[0].split()[1]) <= 0


# ---- chat, serve ------------------------------------------------------------------------------


def test_chat_gives_every_turn_the_constraint(monkeypatch, fake_grammar):
    from tui.app import ChatApp, ChatSettings

    from .test_tui_helpers import drive, fake_engine, type_and_send, until_answered, until_ready

    built = []
    monkeypatch.setattr("tui.app.ChatApp", lambda factory, settings: built.append(settings)
                        or SimpleNamespace(run=lambda: None, close_engine=lambda: None))
    res = CliRunner().invoke(cli, ["chat", "--pair", "tiny", "--grammar", YES_NO,
                                   "--repeat-penalty", "1.2"])
    assert res.exit_code == 0, res.output
    assert built[0].constraint == Constraint.grammar(YES_NO)
    assert built[0].sampling.repeat_penalty == 1.2
    monkeypatch.undo()
    monkeypatch.setattr(engine_module, "Matcher",
                        lambda constraint, tokenizer, n_vocab: FakeMatcher(n_vocab, 5))

    calls: list = []
    engine = recording(constrainable(fake_engine()), calls)
    app = ChatApp(lambda: engine, ChatSettings(max_tokens=8, drafter="hybrid", draft_length=4,
                                               constraint=Constraint.json_object()))

    async def scenario(pilot):
        await until_ready(pilot)
        for n, text in enumerate(("one", "two")):
            await type_and_send(pilot, text)
            await until_answered(pilot, 2 * (n + 1))

    drive(app, scenario)
    assert [kw["constraint"] for kw in calls] == [Constraint.json_object()] * 2


def test_serve_penalties_are_the_requests_defaults(monkeypatch):
    from .serve_util import fake_engine

    seen = {}
    engine = fake_engine()

    def create_app(engine, settings):
        seen["defaults"] = settings.defaults
        return object()

    monkeypatch.setattr("edgespec.cli.serve.load_engine", lambda opts, progress=True: engine)
    monkeypatch.setattr("edgespec.server.app.create_app", create_app)
    monkeypatch.setattr("edgespec.server.run.run_server", lambda *a, **k: None)
    res = CliRunner().invoke(cli, ["serve", "--pair", "tiny", "--port", "0",
                                   "--presence-penalty", "0.4", "--logit-bias", "3=-100"])
    assert res.exit_code == 0, res.output
    s = seen["defaults"].sampling
    assert s.presence_penalty == 0.4 and s.logit_bias == ((3, -100.0),)


# ---- verify -----------------------------------------------------------------------------------


def _verify_engine():
    from edgespec.runtime.engine import Engine

    from .fakes import pair

    target, draft = pair(16, seed=2, n_ctx=512)
    target.path, draft.path = Path("t.gguf"), Path("d.gguf")
    target.options = SimpleNamespace(rpc=(), batch_consistent=True)
    return constrainable(Engine(target, draft, drafter="model", draft_length=3))


def test_verify_gives_both_sides_the_constraint_and_the_penalties(fake_grammar):
    from edgespec.bench.verify import verify_greedy, verify_sampling
    from edgespec.core.sampling import SamplingParams

    engine = _verify_engine()
    calls: list = []
    recording(engine, calls, "complete")
    grammar = Constraint.grammar(YES_NO)
    params = SamplingParams(temperature=0.8, presence_penalty=0.5, logit_bias={3: -2})
    greedy = verify_greedy(engine, [("p", "abcabc", False)], ["model", "lookup"], 24,
                           params=params, constraint=grammar)
    assert [kw["drafter"] for kw in calls] == ["none", "model", "lookup"]
    assert all(kw["constraint"] == grammar for kw in calls)
    assert all(kw["sampling"].greedy and kw["sampling"].presence_penalty == 0.5
               and kw["sampling"].logit_bias == ((3, -2.0),) for kw in calls)
    assert all(r.equal and r.passed for r in greedy)
    # the grammar forces tokens (FakeMatcher allows one token after a quarter of prefixes):
    # they are drafted ahead as 'forced', not counted as the drafter's
    model = greedy[0]
    assert model.forced > 0 and model.drafted > 0
    calls.clear()
    sampled = verify_sampling(engine, "abcabc", ["model"], params, tokens=2, samples=20,
                              permutations=99, chat=False, constraint=grammar)
    assert len(calls) == 40 and all(kw["constraint"] == grammar for kw in calls)
    assert [kw["drafter"] for kw in calls] == ["none"] * 20 + ["model"] * 20
    assert sampled[0].passed and sampled[0].drafted > 0


def test_verify_command_passes_the_constraint_and_reports_it(monkeypatch, fake_grammar,
                                                           tmp_path):
    calls: list = []
    monkeypatch.setattr("edgespec.cli.options.load_engine",
                        lambda opts, progress=True: recording(_verify_engine(), calls, "complete"))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "p", "kind": "chat", "prompt": "abcabc"}) + "\n")
    args = ["verify", "--grammar", YES_NO, "--drafters", "model", "--prompts", str(prompts),
            "--greedy-tokens", "8", "--samples", "20", "--tokens", "2", "--prompt", "abcabc",
            "--raw", "--repeat-penalty", "1.3"]
    res = CliRunner().invoke(cli, [*args, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["passed"] and out["settings"]["constraint"] == "grammar"
    assert out["settings"]["shaping"] == "--repeat-penalty 1.3 --repeat-last-n 64"
    assert {r["forced"] >= 0 for r in out["greedy"] + out["sampling"]} == {True}
    assert all(kw["constraint"] == Constraint.grammar(YES_NO) for kw in calls)
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert "constraint: grammar, on both sides" in res.stdout
    assert "shaping: --repeat-penalty 1.3 --repeat-last-n 64, on both sides" in res.stdout
    assert "accepted   forced  result" in res.stdout


# ---- the tiny model ---------------------------------------------------------------------------

EXE = Path(sys.executable).with_name("edgespec")


def edgespec(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    # one thread: on a busy 2-core machine llama.cpp's second thread waits more than it works
    return subprocess.run([str(EXE), *args, "--pair", "tiny", "--threads", "1"], text=True,
                          capture_output=True, timeout=timeout, env=dict(os.environ),
                          stdin=subprocess.DEVNULL)


@pytest.mark.real
def test_complete_with_a_schema_gives_json_that_validates_on_the_tiny_model(tmp_path):
    import jsonschema

    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    for drafter in ("none", "lookup"):
        res = edgespec("complete", "Describe a person as JSON.", "--schema", str(schema),
                       "--json", "-n", "64", "--drafter", drafter, "--logprobs", "1")
        assert res.returncode == 0, res.stderr
        out = json.loads(res.stdout)
        assert out["finish_reason"] == "stop", out
        jsonschema.validate(json.loads(out["text"]), PERSON)
        assert len(out["logprobs"]) == out["tokens"]
        # the schema forces keys and punctuation: drafted ahead as 'forced' (not by 'none',
        # plain decoding)
        forced = out["stats"]["by_drafter"].get("forced", {}).get("accepted", 0)
        assert (forced > 0) == (drafter != "none"), out["stats"]


@pytest.mark.real
def test_verify_with_a_grammar_passes_on_the_tiny_model(tmp_path):
    grammar = tmp_path / "yes.gbnf"
    grammar.write_text(YES_NO)
    # few-shot: after "yes," prompt lookup copies the answers' words (exercising rejection
    # under the grammar), and ", because" is forced
    prompt = ("Q: Is the cat on the mat?\nA:yes, because the cat sat on the mat\n"
              "Q: Is the dog on the mat?\nA:no, because the dog sat on the rug\n"
              "Q: Is the cat on the rug?\nA:")
    prompts = tmp_path / "prompts.jsonl"  # the greedy audit's: the same text, and a chat
    prompts.write_text("".join(json.dumps(p) + "\n" for p in (
        {"id": "few-shot", "kind": "chat", "prompt": prompt, "raw": True},
        {"id": "question", "kind": "chat", "prompt": "Is the sea blue? Say why."})))
    res = edgespec("verify", "--grammar", str(grammar), "--prompt", prompt, "--raw",
                   "--drafters", "lookup,model", "--prompts", str(prompts),
                   "--greedy-tokens", "16", "--samples", "30", "--tokens", "6",
                   "--alpha", "0.001", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    out = json.loads(res.stdout)
    assert out["passed"] and out["settings"]["constraint"] == "grammar"
    assert all(r["equal"] for r in out["greedy"])
    lookup, model = out["sampling"]
    assert lookup["drafter"] == "lookup" and lookup["drafted"] > lookup["accepted"] > 0
    assert model["accepted"] == model["drafted"] > 0  # the tiny pair's draft is its target
