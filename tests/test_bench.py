"""``edgespec bench`` without llama.cpp: aggregation, interleaving, prompt files, the reference
path's bookkeeping, and the whole command over scripted fake models (table, JSON, plot, Ctrl-C)."""

from __future__ import annotations

import contextlib
import json
import math
import struct
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

from edgespec.bench.prompts import (
    BenchPrompt,
    code_blocks,
    load_prompts,
    long_prompt,
    select_prompts,
)
from edgespec.bench.reference import _Recorder, measure
from edgespec.bench.run import (
    Config,
    EdgespecRunner,
    Measurement,
    aggregate,
    geometric_mean,
    parse_drafters,
    parse_lengths,
    parse_temperatures,
    plan_runs,
    rotate,
)
from edgespec.cli import bench as bench_cli
from edgespec.cli.main import cli
from edgespec.errors import ConfigError, ModelError
from edgespec.runtime.engine import Engine

from .fakes import Clock, Table, TimedLM, pair, use_clock


def run(prompt, config, tps, *, kind="edit", temp=0.0, rounds=10, drafted=0, accepted=0,
        generated=10, decode=1.0, llama=None, target=0.8):
    return {"prompt": prompt, "kind": kind, "config": config, "drafter": config.split("@")[0],
            "draft_length": int(config.split("@")[1]) if "@" in config else None,
            "temperature": temp, "tokens_per_second": tps, "generated": generated, "rounds": rounds,
            "drafted": drafted, "accepted": accepted, "decode_time": decode,
            "time": {"drafting": 0.1, "target": target, "sampling": 0.05, "other": 0.05,
                     "llama": llama}}


# ---- aggregation -----------------------------------------------------------------------------


def test_geometric_mean():
    assert geometric_mean([2.0, 8.0]) == pytest.approx(4.0)
    assert geometric_mean([1.5]) == pytest.approx(1.5)
    assert geometric_mean([]) is None
    assert geometric_mean([None, 0.0, 4.0]) == pytest.approx(4.0)  # only positive values count


def test_ratios_are_medians_over_repeats_against_none_in_the_same_run():
    runs = [
        run("a", "none", 10), run("a", "none", 12), run("a", "none", 100),   # median 12
        run("a", "lookup", 24), run("a", "lookup", 30), run("a", "lookup", 1),  # median 24
        run("b", "none", 20, kind="chat"), run("b", "lookup", 10, kind="chat"),
    ]
    agg = aggregate(runs)
    per = {(a["prompt"], a["config"]): a for a in agg["per_prompt"]}
    assert per["a", "none"]["tokens_per_second"] == 12
    assert per["a", "lookup"]["tokens_per_second"] == 24
    assert per["a", "lookup"]["ratio_vs_none"] == pytest.approx(2.0)
    assert per["b", "lookup"]["ratio_vs_none"] == pytest.approx(0.5)
    overall = {o["config"]: o for o in agg["overall"]}
    assert overall["lookup"]["ratio_vs_none"] == pytest.approx(1.0)  # sqrt(2 * 0.5)
    assert overall["lookup"]["min_ratio_vs_none"] == pytest.approx(0.5)
    assert overall["lookup"]["min_ratio_prompt"] == "b"
    assert overall["lookup"]["ratio_vs_none_by_kind"] == {"edit": pytest.approx(2.0),
                                                          "chat": pytest.approx(0.5)}
    assert overall["none"]["ratio_vs_none"] == pytest.approx(1.0)
    assert overall["none"]["ratio_vs_reference"] is None  # no reference was run


def test_ratios_never_mix_temperatures():
    runs = [run("a", "none", 10), run("a", "lookup", 20),
            run("a", "none", 5, temp=0.8), run("a", "lookup", 20, temp=0.8)]
    agg = aggregate(runs)
    ratio = {(o["temperature"], o["config"]): o["ratio_vs_none"] for o in agg["overall"]}
    assert ratio[0.0, "lookup"] == pytest.approx(2.0)
    assert ratio[0.8, "lookup"] == pytest.approx(4.0)
    [kept] = [r for r in agg["temperature_retention"] if r["config"] == "lookup"]
    assert kept["retained"] == pytest.approx(2.0)


def test_acceptance_and_time_split_are_pooled_over_runs():
    runs = [run("a", "none", 10, llama=0.9),
            run("a", "lookup", 20, rounds=4, drafted=8, accepted=6, generated=10, llama=0.7),
            run("a", "lookup", 20, rounds=6, drafted=2, accepted=0, generated=6, llama=0.7)]
    agg = aggregate(runs)
    o = {o["config"]: o for o in agg["overall"]}["lookup"]
    assert o["acceptance_rate"] == pytest.approx(6 / 10)
    assert o["mean_accepted"] == pytest.approx(6 / 10)
    assert o["tokens_per_round"] == pytest.approx(16 / 10)
    assert o["time_split"]["target"] == pytest.approx(0.8)
    assert sum(o["time_split"].values()) == pytest.approx(1.0)
    assert o["outside_llama"] == pytest.approx(0.3) and o["outside_llama_basis"] == "llama"
    none = {o["config"]: o for o in agg["overall"]}["none"]
    assert none["acceptance_rate"] is None  # nothing drafted


def test_python_overhead_falls_back_to_target_time_without_a_llama_timer():
    agg = aggregate([run("a", "none", 10, target=0.95)])
    o = agg["overall"][0]
    assert o["outside_llama"] == pytest.approx(0.05) and o["outside_llama_basis"] == "target"


def test_speedup_against_draft_length_uses_the_edit_prompts():
    runs = [run("a", "none", 10), run("a", "lookup@2", 15), run("a", "lookup@8", 30),
            run("c", "none", 10, kind="chat")]
    rows = {(r["drafter"], r["draft_length"]): r["ratio_vs_none"] for r in aggregate(runs)["by_length"]}
    assert rows == {("lookup", 2): pytest.approx(1.5), ("lookup", 8): pytest.approx(3.0)}


# ---- plan ------------------------------------------------------------------------------------


def test_rotate():
    assert rotate("ABC", 0) == list("ABC")
    assert rotate("ABC", 1) == list("BCA")
    assert rotate("ABC", 4) == list("BCA")


def test_plan_interleaves_configurations_and_rotates_their_order_each_repeat():
    edit, chat = BenchPrompt("e", "edit", "x"), BenchPrompt("c", "chat", "y")
    a, b, c = Config("none"), Config("lookup"), Config("llama-cpp-python")
    k2 = Config("lookup", 2)
    plan = plan_runs([edit, chat], [a, b, c], repeats=2, temperatures=(0.0, 0.8), edit_only=[k2])
    order = [(p.temperature, p.repeat, p.prompt.id, p.config.label) for p in plan]
    assert order[:7] == [
        (0.0, 0, "e", "none"), (0.0, 0, "e", "lookup"), (0.0, 0, "e", "llama-cpp-python"),
        (0.0, 0, "e", "lookup@2"),
        (0.0, 0, "c", "none"), (0.0, 0, "c", "lookup"), (0.0, 0, "c", "llama-cpp-python"),
    ]
    assert [lbl for t, r, p, lbl in order if (t, r, p) == (0.0, 1, "e")] == \
        ["lookup", "llama-cpp-python", "lookup@2", "none"]
    assert len(plan) == 2 * 2 * (4 + 3)
    assert not any(p.config == k2 and p.prompt.kind != "edit" for p in plan)


def test_the_draft_cache_is_primed_before_each_prompt_so_no_run_pays_its_prefill():
    from edgespec.bench.run import Runners, execute
    from edgespec.core.sampling import SamplingParams

    target, draft = pair(16, n_ctx=512)
    engine = Engine(target, draft, drafter="hybrid")
    prompt = BenchPrompt("e", "edit", "some prompt text to copy from")
    tokens = engine.prompt_tokens(prompt.payload)
    plan = plan_runs([prompt], [Config("none"), Config("model")], repeats=1)
    execute(plan, Runners(EdgespecRunner(engine)), SamplingParams(), 6, [])
    first, second = draft.calls[:2]
    assert first.n_logits == 0 and list(first.tokens) == tokens[:-1]  # primed, before any run
    assert len(second.tokens) == 1  # the model run only feeds the prompt's last token


def test_option_parsing():
    known = ("none", "lookup", "model", "hybrid", "auto")
    assert parse_drafters("lookup, llama-cpp-python", known) == ["none", "lookup", "llama-cpp-python"]
    with pytest.raises(ConfigError, match="magic"):
        parse_drafters("lookup,magic", known)
    with pytest.raises(ConfigError, match="repeated"):
        parse_drafters("lookup,lookup", known)
    assert parse_lengths("1,2,16", 64) == [1, 2, 16] and parse_lengths(None, 64) == []
    with pytest.raises(ConfigError, match="outside"):
        parse_lengths("0,4", 64)
    assert parse_temperatures("0,0.8") == [0.0, 0.8]
    with pytest.raises(ConfigError, match="temperature"):
        parse_temperatures("-1")


# ---- prompts ---------------------------------------------------------------------------------


def test_builtin_prompts_cover_edits_code_chat_and_structured():
    prompts = load_prompts()
    kinds = [p.kind for p in prompts]
    assert kinds.count("edit") == 3 and kinds.count("code") == 2 and kinds.count("chat") == 2
    assert kinds.count("structured") == 4
    blocks = code_blocks(prompts)
    assert len(blocks) == 3 and all(40 <= len(b.splitlines()) <= 70 for b in blocks)
    for block in blocks:
        compile(block, "<edit prompt>", "exec")  # real Python
    assert any(p.messages for p in prompts)


def test_builtin_structured_prompts_carry_schemas_and_answers_that_match_them():
    import jsonschema
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    structured = [p for p in load_prompts() if p.kind == "structured"]
    assert {p.id for p in structured} == {"structured-people", "structured-orders",
                                          "structured-functions", "structured-tool-call"}
    assert any(p.messages for p in structured)  # the tool call: the function in a system message
    for p in structured:
        schema, answer = json.loads(p.schema), json.loads(p.answer)
        jsonschema.validate(answer, schema)
        assert p.to_dict()["schema"] == schema and p.to_dict()["answer"] == answer
        assert list(schema["properties"]) == list(answer)  # the schema's key order is kept
        assert "root ::=" in json_schema_to_gbnf(p.schema)  # the reference's grammar
        assert p.max_tokens and len(p.answer) < 4 * p.max_tokens  # room for the answer
    # every other kind has neither
    assert all(p.schema is None and p.answer is None for p in load_prompts() if p.kind != "structured")


def test_check_answer():
    from edgespec.bench.prompts import check_answer

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    assert check_answer('{"n": 3}', schema) is None
    assert check_answer('{"n": 3}', json.dumps(schema)) is None
    assert "not JSON" in check_answer('{"n": 3', schema)
    assert "'n'" in check_answer('{"n": "three"}', schema)
    assert "required" in check_answer("{}", schema)


_SCHEMA = '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}'


@pytest.mark.parametrize("line, message", [
    ('{"id": "a", "kind": "structured", "prompt": "x"}', "needs a 'schema'"),
    ('{"id": "a", "kind": "chat", "prompt": "x", "schema": ' + _SCHEMA + '}', "goes with kind structured"),
    ('{"id": "a", "kind": "chat", "prompt": "x", "answer": {}}', "'answer' goes with a 'schema'"),
    ('{"id": "a", "kind": "structured", "prompt": "x", "schema": [1]}', "must be a JSON object"),
    ('{"id": "a", "kind": "structured", "prompt": "x", "schema": {"type": "nope"}}', "bad JSON schema"),
    ('{"id": "a", "kind": "structured", "prompt": "x", "schema": {"$ref": "#/$defs/none"}}',
     "bad JSON schema"),
    ('{"id": "a", "kind": "structured", "prompt": "x", "schema": ' + _SCHEMA + ', "answer": {"a": "b"}}',
     "'answer' does not match the schema: ['a']"),
])
def test_bad_schemas_are_config_errors_naming_the_line(tmp_path, line, message):
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "ok", "kind": "structured", "prompt": "fine", "schema": ' + _SCHEMA
                    + ', "answer": {"a": 1}}\n' + line + "\n")
    with pytest.raises(ConfigError, match="p.jsonl:2") as err:
        load_prompts(path)
    assert message in str(err.value)


@pytest.mark.parametrize("line, message", [
    ("not json", "invalid JSON"),
    ("[1, 2]", "JSON object"),
    ('{"id": "a", "kind": "poem", "prompt": "x"}', "'kind'"),
    ('{"id": "a", "kind": "chat"}', "exactly one of"),
    ('{"id": "a", "kind": "chat", "prompt": "x", "messages": []}', "exactly one of"),
    ('{"id": "", "kind": "chat", "prompt": "x"}', "'id'"),
    ('{"id": "a", "kind": "chat", "prompt": "  "}', "'prompt'"),
    ('{"id": "a", "kind": "chat", "messages": [{"role": "robot", "content": "x"}]}', "messages[0]"),
    ('{"id": "a", "kind": "chat", "prompt": "x", "max_tokens": 0}', "max_tokens"),
    ('{"id": "a", "kind": "chat", "prompt": "x", "temperature": 1}', "unknown field"),
    ('{"id": "a", "kind": "chat", "messages": [{"role": "user", "content": "x"}], "raw": true}', "raw"),
])
def test_bad_prompt_lines_name_the_line_and_the_problem(tmp_path, line, message):
    path = tmp_path / "p.jsonl"
    path.write_text('# a comment\n{"id": "ok", "kind": "code", "prompt": "fine"}\n\n' + line + "\n")
    with pytest.raises(ConfigError, match="p.jsonl:4") as err:
        load_prompts(path)
    assert message in str(err.value)


def test_prompt_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="prompt file: no such file"):
        load_prompts(tmp_path / "missing.jsonl")
    dup = tmp_path / "dup.jsonl"
    dup.write_text('{"id": "a", "kind": "chat", "prompt": "x"}\n' * 2)
    with pytest.raises(ConfigError, match="duplicate id"):
        load_prompts(dup)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("# nothing\n")
    with pytest.raises(ConfigError, match="no prompts"):
        load_prompts(empty)


def test_select_prompts():
    prompts = load_prompts()
    assert [p.kind for p in select_prompts(prompts, kinds=["chat"])] == ["chat", "chat"]
    assert len(select_prompts(prompts, kinds=["structured"])) == 4
    assert [p.id for p in select_prompts(prompts, only=["chat-trip", "edit-rename"])] == \
        ["edit-rename", "chat-trip"]
    with pytest.raises(ConfigError, match="no prompt with id nope"):
        select_prompts(prompts, only=["nope"])
    with pytest.raises(ConfigError, match="no prompt left"):
        select_prompts(prompts, only=["chat-trip"], kinds=["edit"])


def test_long_prompt_stays_within_the_token_budget():
    def count(text):  # a stand-in tokenizer: one token per 4 characters
        return math.ceil(len(text) / 4)

    text = long_prompt(count, 2000)
    assert 1900 <= count(text) <= 2000
    assert "class Inventory" in text and text.endswith("?\n")


# ---- the reference path's bookkeeping ---------------------------------------------------------


def test_reference_measurement_excludes_the_first_token_and_counts_rounds():
    rec = _Recorder()
    rec.prompt_tokens = 50
    rec.evals = [(0.0, 1.0), (1.1, 1.2), (1.3, 1.4)]        # prefill, then two rounds
    rec.decodes = [(0.0, 0.9), (1.1, 1.18), (1.3, 1.38)]
    rec.drafts = [(1.01, 1.02, 4), (1.21, 1.22, 4)]          # each round proposed 4 tokens
    # 1 token from the prefill, 3 from round 2 (2 accepted drafts), 2 from round 3 (1 accepted)
    rec.samples = [(1.0, 1.005, False), (1.2, 1.205, False), (1.205, 1.21, False),
                   (1.21, 1.215, False), (1.4, 1.405, False), (1.405, 1.41, False)]
    m = measure(rec, "length", logits_all=True)
    assert m.generated == 6 and m.rounds == 3 and m.drafted == 8 and m.accepted == 3
    assert m.decode_time == pytest.approx(1.41 - 1.005)
    assert m.tokens_per_second == pytest.approx(5 / (1.41 - 1.005))
    assert m.time_target == pytest.approx(0.2) and m.time_llama == pytest.approx(0.16)
    assert m.time_drafting == pytest.approx(0.02)
    assert m.prompt_tokens == 50 and m.detail["logits_all"]


def test_reference_end_of_generation_token_is_not_output():
    rec = _Recorder()
    rec.evals = [(0.0, 1.0), (1.0, 1.1)]
    rec.samples = [(1.0, 1.0, False), (1.1, 1.2, True)]
    m = measure(rec, "stop")
    assert m.generated == 1 and m.drafted == 0 and m.accepted == 0


class CapturingLlama:
    """Stands in for ``llama_cpp.Llama``: records the keyword arguments it was created with."""

    created: list[dict] = []

    def __init__(self, **kwargs):
        CapturingLlama.created.append(kwargs)
        self._model = SimpleNamespace(vocab=None)
        self.n_tokens = 0
        self.sample = self.eval = lambda *a, **k: 0

    def close(self):
        pass


@pytest.mark.parametrize("ngl", [0, 12, -1])
def test_both_reference_llamas_use_the_targets_offload(monkeypatch, ngl):
    from edgespec.bench.reference import ReferenceRunner

    monkeypatch.setattr("llama_cpp.Llama", CapturingLlama)
    monkeypatch.setattr(CapturingLlama, "created", [])
    runner = ReferenceRunner("target.gguf", 512, 2, n_gpu_layers=ngl)
    runner._llama("llama-cpp-python")
    runner._llama("llama-cpp-python-plain")
    assert [kw["n_gpu_layers"] for kw in CapturingLlama.created] == [ngl, ngl]
    assert [kw["model_path"] for kw in CapturingLlama.created] == ["target.gguf"] * 2
    described = runner.describe()
    assert {d["n_gpu_layers"] for d in described.values()} == {ngl}
    assert {d["flash_attn"] for d in described.values()} == {False}


# ---- the whole command over fakes -------------------------------------------------------------


class FakeReference:
    """Stands in for llama-cpp-python: a fixed speed, every run."""

    closed = False
    kwargs: dict = {}

    def __init__(self, *args, **kwargs):
        FakeReference.kwargs = kwargs

    prompts: list = []

    def run(self, config, prompt, max_tokens, sampling) -> Measurement:
        FakeReference.prompts.append(prompt)
        m = Measurement(max_tokens, 40.0, max_tokens / 40.0, 12, max_tokens, 0, 0, 0.0,
                        0.9 * max_tokens / 40.0, 0.0, "length", time_llama=None)
        return m.check(prompt, "x" * max_tokens)

    def describe(self):
        return {"llama-cpp-python": {"logits_all": True}, "llama-cpp-python-plain": {}}

    def close(self):
        FakeReference.closed = True


@pytest.fixture
def fake_bench(monkeypatch, tmp_path):
    """`edgespec bench` over a fake target/draft pair and a fake reference; short prompts."""
    target, draft = pair(16, n_ctx=512, draft="perturbed")
    engine = Engine(target, draft, drafter="hybrid")
    monkeypatch.setattr(bench_cli, "_load", lambda opts: contextlib.nullcontext(engine))
    monkeypatch.setattr("edgespec.bench.reference.ReferenceRunner", FakeReference)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        '{"id": "e1", "kind": "edit", "prompt": "abcabcabcabcabc abcabcabc"}\n'
        '{"id": "c1", "kind": "code", "prompt": "def f(x): return x", "max_tokens": 6}\n'
        '{"id": "t1", "kind": "chat", "messages": [{"role": "system", "content": "hi"}, '
        '{"role": "user", "content": "hello there"}]}\n')

    def invoke(*args):
        return CliRunner().invoke(cli, ["bench", "--prompts", str(prompts), "--json",
                                        str(tmp_path / "r.json"), *args])

    return invoke, tmp_path


def test_bench_prints_tables_and_writes_json_and_plot(fake_bench):
    invoke, tmp = fake_bench
    res = invoke("--drafters", "none,lookup,model,hybrid,llama-cpp-python", "--repeats", "2",
                 "-n", "10", "--lengths", "1,3", "--temperature", "0,0.8", "--seed", "4")
    assert res.exit_code == 0, res.output
    out = res.output
    assert "x none" in out and "overall, greedy (temperature 0)" in out
    assert "overall, temperature 0.8" in out and "keeps" in out
    assert "speedup against draft length" in out
    doc = json.loads((tmp / "r.json").read_text())
    assert doc["schema"] == "edgespec-bench/1" and doc["complete"] is True
    assert {"settings", "machine", "prompts", "configs", "runs", "aggregates", "peak_rss_mb"} <= set(doc)
    labels = {"none", "lookup", "model", "hybrid", "llama-cpp-python"}
    seen = {(r["temperature"], r["prompt"], r["config"]) for r in doc["runs"]}
    for t in (0.0, 0.8):
        for p in ("e1", "c1", "t1"):
            assert {(t, p, c) for c in labels} <= seen
        assert {(t, "e1", f"{d}@{k}") for d in ("lookup", "model") for k in (1, 3)} <= seen
    assert not any(r["draft_length"] for r in doc["runs"] if r["prompt"] != "e1")
    assert len(doc["runs"]) == 2 * 2 * (3 * 5 + 4)
    for r in doc["runs"]:
        assert set(r["time"]) == {"drafting", "target", "sampling", "other", "llama"}
        assert r["generated"] == (6 if r["prompt"] == "c1" else 10)
    sampled = {r["seed"] for r in doc["runs"] if r["temperature"] == 0.8}
    assert sampled == {4, 5}  # seed + repeat
    assert (tmp / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert FakeReference.closed
    assert doc["settings"]["reference"] == {"llama-cpp-python": {"logits_all": True}}


#: the structured fake's vocabulary: printable ASCII, one character a token, then an end token
_ASCII = [bytes([c]) for c in range(32, 127)]
_EOS = len(_ASCII)
_ENUM_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["pet", "ok", "n"],
                "properties": {"pet": {"enum": ["cat", "dog"]}, "ok": {"type": "boolean"},
                               "n": {"enum": [1, 22, 333]}}}


class _AsciiTokenizer:
    """What llguidance's TokenizerWrapper reads: the fake's vocabulary, one byte a token."""

    eos_token_id, bos_token_id, special_token_ids = _EOS, None, [_EOS]
    tokens = [*_ASCII, b"<eos>"]

    def __call__(self, text):
        return [b - 32 for b in (text.encode() if isinstance(text, str) else text)]


@pytest.fixture
def structured_bench(monkeypatch, tmp_path):
    """`edgespec bench` over a fake pair whose vocabulary can write JSON (a real llguidance
    matcher over it), a fake reference, and one structured prompt whose schema leaves a few
    choices (every answer it allows is short and valid) beside a chat prompt."""
    import llguidance

    from .fakes import FakeLM, Perturbed

    table = Table(len(_ASCII) + 1, 3)
    target = FakeLM(table, n_ctx=512, vocab=[*_ASCII, b""], eog=[_EOS])
    draft = FakeLM(Perturbed(table, 3, 1.0), n_ctx=512, vocab=[*_ASCII, b""], eog=[_EOS])
    target.constraint_tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_AsciiTokenizer()))
    engine = Engine(target, draft, drafter="hybrid")
    monkeypatch.setattr(bench_cli, "_load", lambda opts: contextlib.nullcontext(engine))
    monkeypatch.setattr("edgespec.bench.reference.ReferenceRunner", FakeReference)
    FakeReference.prompts = []
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        json.dumps({"id": "s1", "kind": "structured", "prompt": "Pick a pet as JSON.",
                    "schema": _ENUM_SCHEMA, "answer": {"pet": "cat", "ok": True, "n": 22},
                    "max_tokens": 60}) + "\n"
        '{"id": "t1", "kind": "chat", "prompt": "hello there"}\n')

    def invoke(*args):
        return CliRunner().invoke(cli, ["bench", "--prompts", str(prompts), "--json",
                                        str(tmp_path / "r.json"), *args])

    return invoke, tmp_path


def test_structured_prompts_run_under_their_schema_and_report_validity_and_forced_share(
        structured_bench):
    invoke, tmp = structured_bench
    res = invoke("--drafters", "none,lookup,model,llama-cpp-python-plain", "--repeats", "2",
                 "-n", "12", "--temperature", "0,0.8", "--no-warmup")
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp / "r.json").read_text())
    runs = [r for r in doc["runs"] if r["prompt"] == "s1"]
    assert len(runs) == 2 * 2 * 4
    for r in runs:
        if r["config"] == "llama-cpp-python-plain":  # the fake reference's answer: not JSON
            assert r["valid"] is False and r["invalid"].startswith("not JSON") and r["forced"] is None
            continue
        text = r["detail"]["text"]
        assert json.loads(text) in [{"pet": p, "ok": ok, "n": n} for p in ("cat", "dog")
                                    for ok in (True, False) for n in (1, 22, 333)], text
        assert r["valid"] is True and r["invalid"] is None and r["finish_reason"] == "stop"
        by = r["detail"]["stats"]["by_drafter"]
        if r["config"] == "none":  # plain decoding drafts nothing, the grammar's tokens neither
            assert r["forced"] == 0 and "forced" not in by
        else:  # the keys and punctuation are forced: most of the answer
            assert r["forced"] == by["forced"]["accepted"] == by["forced"]["drafted"]
            assert r["forced"] >= r["generated"] / 2
    # the chat prompt is unconstrained and unchecked
    assert all(r["valid"] is None and r["forced"] is None and "text" not in r["detail"]
               for r in doc["runs"] if r["prompt"] == "t1")
    # the reference got the prompt with its schema
    assert {p.id for p in FakeReference.prompts if p.schema} == {"s1"}
    per = {(a["temperature"], a["prompt"], a["config"]): a for a in doc["aggregates"]["per_prompt"]}
    lookup = per[0.0, "s1", "lookup"]
    assert lookup["checked"] == lookup["valid"] == 2
    assert lookup["forced_share"] == pytest.approx(
        sum(r["forced"] for r in runs if r["config"] == "lookup" and r["temperature"] == 0)
        / sum(r["generated"] for r in runs if r["config"] == "lookup" and r["temperature"] == 0))
    assert per[0.0, "s1", "none"]["forced_share"] == 0.0
    assert per[0.0, "s1", "llama-cpp-python-plain"]["valid"] == 0
    assert per[0.0, "s1", "llama-cpp-python-plain"]["forced_share"] is None
    assert per[0.0, "t1", "lookup"]["checked"] is None
    overall = {(o["temperature"], o["config"]): o for o in doc["aggregates"]["overall"]}
    assert overall[0.8, "model"]["checked"] == overall[0.8, "model"]["valid"] == 2
    assert set(overall[0.0, "lookup"]["ratio_vs_none_by_kind"]) == {"structured", "chat"}
    assert doc["prompts"][0]["schema"] == _ENUM_SCHEMA
    # the tables: valid and forced columns, dashes where a prompt is not structured
    lines = res.output.splitlines()
    header = next(line for line in lines if line.startswith("prompt "))
    assert header.split()[-2:] == ["valid", "forced"]
    row = next(line for line in lines if line.startswith("s1 ")).split()
    assert row[-2] == "2/2" and row[-1].endswith("%")
    chat_rows = [line.split() for line in lines if line.startswith("t1 ")]
    assert chat_rows and all(r[-2:] == ["-", "-"] for r in chat_rows)
    overall_header = next(line for line in lines if line.startswith("drafter "))
    assert "structured" in overall_header.split() and overall_header.split()[-2:] == ["valid", "forced"]
    assert "forced = share of the generated tokens drafted as source forced" in res.output


def test_tables_have_no_structured_columns_without_structured_prompts(fake_bench):
    invoke, tmp = fake_bench
    res = invoke("--drafters", "none,lookup", "-n", "4", "--repeats", "1", "--no-warmup")
    assert res.exit_code == 0, res.output
    assert "valid" not in res.output and "forced" not in res.output
    header = next(line for line in res.output.splitlines() if line.startswith("drafter ")).split()
    assert header[7:10] == ["edit", "code", "chat"] and "structured" not in header


def test_the_reference_runs_with_the_targets_offload_and_the_settings_record_it(fake_bench):
    from edgespec.runtime.backend import ModelOptions

    invoke, tmp = fake_bench
    engine = bench_cli._load({}).__enter__()
    engine.target.options = ModelOptions(path=Path("t.gguf"), n_gpu_layers=-1, n_threads=2)
    engine.draft.options = ModelOptions(path=Path("d.gguf"), n_gpu_layers=5, n_threads=2)
    res = invoke("--drafters", "none,llama-cpp-python-plain", "-n", "4", "--repeats", "1",
                 "--no-warmup")
    assert res.exit_code == 0, res.output
    assert FakeReference.kwargs == {"n_gpu_layers": -1}
    settings = json.loads((tmp / "r.json").read_text())["settings"]
    assert settings["n_gpu_layers"] == -1 and settings["draft_n_gpu_layers"] == 5
    assert settings["draft_window"] == 64 and settings["draft_window_mode"] == "host"


def test_a_source_that_cannot_run_here_is_skipped_with_a_reason(fake_bench, monkeypatch):
    invoke, tmp = fake_bench
    alone = Engine(pair(16, n_ctx=512)[0], None, drafter="lookup")  # no draft model loaded
    monkeypatch.setattr(bench_cli, "_load", lambda opts: contextlib.nullcontext(alone))
    res = invoke("--drafters", "none,model", "-n", "4", "--repeats", "1", "--no-warmup")
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp / "r.json").read_text())
    assert doc["skipped"] == [{"config": "model", "reason": "no draft model loaded (--draft)"}]
    assert {r["config"] for r in doc["runs"]} == {"none"}


def test_ctrl_c_stops_and_still_writes_the_partial_results(fake_bench, monkeypatch):
    invoke, tmp = fake_bench
    calls = []
    real_run = EdgespecRunner.run

    def interrupted(self, *args):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real_run(self, *args)

    monkeypatch.setattr(EdgespecRunner, "run", interrupted)
    res = invoke("--drafters", "none,lookup", "-n", "4", "--no-warmup")
    assert res.exit_code == 130
    doc = json.loads((tmp / "r.json").read_text())
    assert doc["complete"] is False and len(doc["runs"]) == 3
    assert "interrupted" in res.output


def test_an_error_mid_run_is_one_line_and_keeps_the_results_so_far(fake_bench):
    invoke, tmp = fake_bench
    prompts = tmp / "long.jsonl"
    prompts.write_text('{"id": "ok", "kind": "chat", "prompt": "short"}\n'
                       '{"id": "long", "kind": "chat", "prompt": "' + "x" * 600 + '"}\n')
    res = invoke("--prompts", str(prompts), "--drafters", "none,lookup", "-n", "4", "--no-warmup")
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "error: the prompt is" in res.output
    doc = json.loads((tmp / "r.json").read_text())
    assert doc["complete"] is False and {r["prompt"] for r in doc["runs"]} == {"ok"}


@pytest.mark.parametrize("args, message", [
    (["--drafters", "magic"], "magic"),
    (["--only", "nope"], "no prompt with id nope"),
    (["--kinds", "poems"], "poems"),
    (["--lengths", "1,x"], "not an integer"),
    (["--temperature", "hot"], "not a number"),
    (["--memory-sides", "edgespec,gpu"], "gpu"),
    (["--no-runs"], "nothing to do"),
])
def test_user_errors_are_one_line_without_traceback(fake_bench, args, message):
    invoke, _ = fake_bench
    res = invoke(*args)
    assert res.exit_code == 2
    assert message in res.output and "Traceback" not in res.output
    assert res.output.strip().count("\n") == 0 and res.output.startswith("error: ")


def test_bad_prompt_file_is_a_user_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "kind": "chat"}\n')
    res = CliRunner().invoke(cli, ["bench", "--prompts", str(bad)])
    assert res.exit_code == 2 and "bad.jsonl:1" in res.output and "Traceback" not in res.output


# ---- sweep, GGUF metadata, plot panels ----------------------------------------------------------


#: the fake GPU of the sweep: a call of width k costs 10 ms + 5 ms per token beyond the first
#: once settled, 4 ms more as the first of its width (no graph), 7 ms more as the second
#: (the capture); the draft model 6 ms a token (it never pays on that curve)
def _sweep_steady(k: int) -> float:
    return 0.010 + 0.005 * (k - 1)


def _sweep_engine(clock: Clock, *, changed: float = 0.004, second: float = 0.007) -> Engine:
    target = TimedLM(Table(16, 1), clock, _sweep_steady, changed=changed, second=second)
    draft = TimedLM(Table(16, 2), clock, lambda k: 0.006 * k)
    return Engine(target, draft, drafter="hybrid", clock=clock)


def test_sweep_table(monkeypatch):
    from edgespec.bench.report import print_sweep
    from edgespec.bench.run import run_sweep
    from edgespec.core.costs import break_even_acceptance
    from edgespec.runtime import calibration

    clock = use_clock(monkeypatch, Clock(), calibration)
    sweep = run_sweep(_sweep_engine(clock), sizes=(1, 2, 4), repeats=1)
    rows = {r["k"]: r for r in sweep["rows"]}
    assert sorted(rows) == [1, 2, 4]
    for k, r in rows.items():  # S(k) steady; the first call of a width U more, the second C
        assert r["t"] == pytest.approx(_sweep_steady(k))
        assert r["t_new"] == pytest.approx(_sweep_steady(k) + 0.004)
        assert r["t_second"] == pytest.approx(_sweep_steady(k) + 0.007)
        assert r["changed"] == pytest.approx(0.004) and r["second"] == pytest.approx(0.007)
    assert rows[4]["t_rel"] == pytest.approx(2.5)
    assert rows[4]["t_per_token"] == pytest.approx(0.025 / 4)
    assert rows[1]["break_even_lookup"] is None  # nothing drafted in a 1-token round
    # a draft that doubles the scored tokens' worth: 1 + a = 15 / 10 (at the steady cost)
    assert rows[2]["break_even_lookup"] == pytest.approx(0.5)
    assert rows[4]["break_even_lookup"] == pytest.approx(
        break_even_acceptance({1: 0.010, 2: 0.015, 4: 0.025}, 3))
    assert rows[2]["break_even_model"] == rows[4]["break_even_model"] == "never"
    assert sweep["draft_cost_per_token"] == pytest.approx(0.006)
    assert sweep["target_curve"] == {str(k): pytest.approx(_sweep_steady(k) + 0.004) for k in rows}
    assert sweep["target_curve_second"] == {
        str(k): pytest.approx(_sweep_steady(k) + 0.007) for k in rows}
    assert sweep["target_curve_repeated"] == {str(k): pytest.approx(_sweep_steady(k)) for k in rows}
    lines: list[str] = []
    print_sweep(sweep, lines.append)
    text = "\n".join(lines)
    assert "6.00 ms per drafted token" in text
    header = next(line for line in lines if "S(k) ms" in line).split()
    assert header[:8] == ["k", "S(k)", "ms", "S(k)/k", "ms", "S(k)/S(1)", "U", "ms"]
    row4 = next(line for line in lines if line.split()[:1] == ["4"]).split()
    assert row4[:6] == ["4", "25.00", "6.25", "2.50", "4.00", "7.00"] and row4[-1] == "never"
    row2 = next(line for line in lines if line.split()[:1] == ["2"]).split()
    assert row2 == ["2", "15.00", "7.50", "1.50", "4.00", "7.00", "50%", "never"]
    # a CPU: a call costs what its width does, whatever came before it: U = C = 0
    sweep = run_sweep(_sweep_engine(clock, changed=0.0, second=0.0), sizes=(1, 2, 4), repeats=1)
    assert all(r["changed"] == pytest.approx(0.0) and r["second"] == pytest.approx(0.0)
               and r["t"] == pytest.approx(_sweep_steady(r["k"])) for r in sweep["rows"])


@pytest.mark.parametrize("gpu", [True, False], ids=["gpu", "cpu"])
def test_machine_info_holds_autos_calibration(gpu, monkeypatch):
    """The bench document's machine record keeps what ``auto``'s calibration measured: the
    steady curve, the fixed width, whether calls keep graphs per width, U and C, the draft
    model's price and how long it took."""
    from edgespec import config
    from edgespec.bench.run import models_info
    from edgespec.runtime import calibration

    clock = use_clock(monkeypatch, Clock(), calibration)
    engine = _sweep_engine(clock, changed=0.004 if gpu else 0.0, second=0.007 if gpu else 0.0)
    assert "calibration" not in models_info(engine)  # (none made yet)
    engine.calibrate()
    cal = models_info(engine)["calibration"]
    assert cal["target_curve"] == {str(k): pytest.approx(_sweep_steady(k))
                                   for k in sorted(config.CALIBRATION_POINTS)}
    assert list(cal["target_curve"]) == [str(k) for k in sorted(config.CALIBRATION_POINTS)]
    assert cal["width"] == 0 and cal["graphs"] is gpu
    assert cal["changed"] == pytest.approx(0.004 if gpu else 0.0)
    assert cal["second"] == pytest.approx(0.007 if gpu else 0.0)
    assert cal["draft_per_token"] == pytest.approx(0.006)
    assert cal["seconds"] == engine.costs.calibration_seconds >= 0.0
    json.dumps(cal)  # (it goes into the bench document)


def _gguf(tmp_path, kvs) -> Path:
    def s(x: str) -> bytes:
        b = x.encode()
        return struct.pack("<Q", len(b)) + b

    body = b""
    for key, vtype, value in kvs:
        body += s(key) + struct.pack("<I", vtype)
        if vtype == 8:
            body += s(value)
        elif vtype == 4:
            body += struct.pack("<I", value)
        elif vtype == 9:
            itype, items = value
            body += struct.pack("<IQ", itype, len(items))
            body += b"".join(s(i) if itype == 8 else struct.pack("<i", i) for i in items)
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + body)
    return path


def test_gguf_metadata_and_kv_cache_size(tmp_path):
    from edgespec.bench.memory import kv_cache_bytes, read_gguf_metadata

    path = _gguf(tmp_path, [
        ("general.architecture", 8, "llama"),
        ("tokenizer.ggml.tokens", 9, (8, ["a", "bc", "def"])),  # skipped
        ("llama.block_count", 4, 2),
        ("llama.attention.head_count", 4, 4),
        ("llama.attention.head_count_kv", 4, 2),
        ("some.ints", 9, (5, [1, -2, 3])),
        ("llama.embedding_length", 4, 64),
    ])
    meta = read_gguf_metadata(path)
    assert meta["llama.block_count"] == 2 and meta["some.ints"] == [1, -2, 3]
    assert meta["tokenizer.ggml.tokens"] is None
    # 2 layers x 2 KV heads x (16 + 16) values per cell (head size 64 / 4), 2 bytes each
    assert kv_cache_bytes(meta, 100) == 100 * 2 * 2 * 32 * 2
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML....")
    with pytest.raises(ModelError, match="not a GGUF"):
        read_gguf_metadata(bad)


def test_plot_has_a_panel_for_auto_draft_lengths_and_the_sweep(tmp_path):
    from edgespec.bench.report import write_plot

    runs = [run("a", "none", 10), dict(run("a", "auto", 20), draft_length_hist={"0": 3, "6": 5})]
    sweep = {"rows": [{"k": 1, "t": 0.01, "t_per_token": 0.01}, {"k": 4, "t": 0.02, "t_per_token": 0.005}],
             "draft_cost_per_token": 0.003}
    doc = {"aggregates": aggregate(runs), "sweep": sweep, "machine": {}}
    assert doc["aggregates"]["overall"][1]["draft_length_hist"] == {"0": 3, "6": 5}
    path = write_plot(doc, tmp_path / "p.png")
    assert path.read_bytes()[:4] == b"\x89PNG"
    assert write_plot({"aggregates": aggregate([run("a", "none", 10)]), "machine": {}},
                      tmp_path / "q.png") is None  # nothing to compare


@pytest.mark.parametrize("window", [0, 64])
def test_overhead_takes_the_draft_window(window, tmp_path, monkeypatch):
    from edgespec.cli.main import cli
    from edgespec.runtime.sources import model as model_source

    seen = set()
    real = model_source.draft_distribution
    monkeypatch.setattr(model_source, "draft_distribution",
                        lambda x, p, n=None, w=0: seen.add(w) or real(x, p, n, w))
    out = tmp_path / "overhead.json"
    res = CliRunner().invoke(cli, ["bench", "--overhead", "--vocab", "2000", "-r", "1",
                                   "--draft-window", str(window), "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["draft_window"] == window
    assert seen == {window}
    assert ("whole draft rows" if window == 0 else f"draft window {window}") in res.output


def test_overhead_device_window_takes_sampled_drafts_from_the_windows(tmp_path, monkeypatch):
    # as on a GPU: every sampled draft comes from a window the synthetic device hands out
    # (window_distribution), none from a whole row on the host (draft_distribution)
    from edgespec.bench.overhead import device_windows, make_pools
    from edgespec.cli.main import cli
    from edgespec.runtime.sources import model as model_source

    _, draft, _ = make_pools(2000)
    ids, logits = device_windows(draft, 64)
    assert ids.shape == logits.shape == (draft.shape[0], 64)
    for r in (0, 5, 96):
        assert np.array_equal(np.sort(logits[r]), np.sort(draft[r])[-64:])
        assert np.array_equal(draft[r, ids[r]], logits[r])
    calls = {"window": 0}
    real = model_source.window_distribution

    def window(*a):
        calls["window"] += 1
        return real(*a)

    def whole_row(x, p, n=None, w=0):
        assert p.greedy, "a sampled draft read a whole row"
        return model_source.draft_distribution.__wrapped__(x, p, n, w)

    monkeypatch.setattr(model_source, "window_distribution", window)
    whole_row.__wrapped__ = model_source.draft_distribution
    monkeypatch.setattr(model_source, "draft_distribution", whole_row)
    out = tmp_path / "overhead.json"
    res = CliRunner().invoke(cli, ["bench", "--overhead", "--vocab", "2000", "-r", "1",
                                   "--device-window", "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["device_window"] is True and doc["draft_window"] == 64
    assert "draft window 64 from the device" in res.output
    assert calls["window"] > 100
    # sampled drafts still get accepted: the windows are the draft rows' own
    by = {(r["drafter"], r["k"], r["sampling"]): r for r in doc["overhead"]}
    assert by[("model", 4, "t0.8")]["tokens"] > 1.5 * by[("model", 4, "t0.8")]["rounds"]


def test_device_window_needs_overhead_and_a_window():
    from edgespec.cli.main import cli

    res = CliRunner().invoke(cli, ["bench", "--device-window"])
    assert res.exit_code != 0 and "--device-window is an option of --overhead" in res.output
    res = CliRunner().invoke(cli, ["bench", "--overhead", "--vocab", "100", "--device-window",
                                   "--draft-window", "0"])
    assert res.exit_code != 0 and "needs a draft window" in res.output
    assert "Traceback" not in res.output


def test_overhead_runs_the_real_loop_on_a_synthetic_model_and_writes_json(tmp_path):
    from edgespec.cli.main import cli

    out = tmp_path / "overhead.json"
    res = CliRunner().invoke(cli, ["bench", "--overhead", "--vocab", "2000", "-r", "1",
                                   "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["vocab"] == 2000
    assert doc["row_passes"] == "compiled"  # (test_rowpass: they are built with the tests)
    assert "compiled row passes" in res.output
    rows = doc["overhead"]
    # every drafter at k=4 and 16 (none once), at greedy, t0.8 and each truncation
    want = {(d, k, s) for d in ("lookup", "model", "hybrid", "auto") for k in (4, 16)
            for s in ("greedy", "t0.8", "t0.8-top_k40", "t0.8-top_p0.95", "t0.8-min_p0.05")}
    want |= {("none", 0, s) for _, _, s in want}
    assert {(r["drafter"], r["k"], r["sampling"]) for r in rows} == want
    for r in rows:
        assert r["tokens"] >= 192 and r["us_per_token"] > 0
        assert r["us_per_round"] >= r["us_per_token"] * 0.99  # a round emits >= 1 token
    by = {(r["drafter"], r["k"], r["sampling"]): r for r in rows}
    # the synthetic text repeats: lookup and the noisy draft model get drafts accepted
    assert by[("lookup", 16, "greedy")]["tokens"] > 1.5 * by[("lookup", 16, "greedy")]["rounds"]
    assert by[("model", 4, "greedy")]["tokens"] > 1.5 * by[("model", 4, "greedy")]["rounds"]
    assert "µs/token" in res.output


def test_overhead_on_recorded_rows(tmp_path):
    # rows saved as a recording is (save_pools): the bench runs on them, says so, and pairs
    # each target row with the draft row of the same position (a draft equal to the target
    # is then always accepted: ~k + 1 tokens a round)
    from edgespec.bench.overhead import load_pools, make_pools, measure, make_prompt, save_pools
    from edgespec.cli.main import cli

    target, _, _ = make_pools(3000)
    rows = tmp_path / "rows.npz"
    save_pools(rows, target[:40], target[:40].copy())
    pools = load_pools(rows)
    assert pools[0].shape == (40, 3000) and pools[2].size >= 4
    r = measure("model", 4, "greedy", pools, make_prompt(pools[2]), 64)
    assert r.tokens >= 4.5 * r.rounds
    out = tmp_path / "overhead.json"
    res = CliRunner().invoke(cli, ["bench", "--overhead", "--recorded", str(rows), "-r", "1",
                                   "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["vocab"] == 3000 and doc["rows"] == str(rows)
    assert f"rows recorded in {rows}" in res.output


@pytest.mark.parametrize("case", ["not-npz", "one-array", "float64", "mismatched"])
def test_overhead_refuses_a_bad_recording(case, tmp_path):
    from edgespec.bench.overhead import load_pools
    from edgespec.errors import ConfigError

    path = tmp_path / "rows.npz"
    a = np.zeros((4, 50), np.float32)
    if case == "not-npz":
        path.write_text("not rows")
    elif case == "one-array":
        np.savez(path, target=a)
    elif case == "float64":
        np.savez(path, target=a.astype(np.float64), draft=a)
    else:
        np.savez(path, target=a, draft=a[:3])
    with pytest.raises(ConfigError, match="rows"):
        load_pools(path)


def test_recorded_needs_overhead_and_no_vocab(tmp_path):
    from edgespec.cli.main import cli

    res = CliRunner().invoke(cli, ["bench", "--recorded", str(tmp_path / "r.npz")])
    assert res.exit_code != 0 and "--recorded is an option of --overhead" in res.output
    res = CliRunner().invoke(cli, ["bench", "--overhead", "--vocab", "100", "--recorded",
                                   str(tmp_path / "r.npz")])
    assert res.exit_code != 0 and "--vocab and --recorded" in res.output
    assert "Traceback" not in res.output


# ---- the mask's cost (--overhead --structured) -------------------------------------------------


def test_answers_are_laid_out_in_the_schemas_key_order():
    from edgespec.bench.masks import answer_text, laid_out

    schema = {"type": "object", "properties": {
        "b": {"type": "array", "items": {"type": "object", "properties": {"y": {}, "x": {}}}},
        "a": {"type": "integer"}}}
    value = {"a": 1, "extra": True, "b": [{"x": 1, "y": 2}, {"x": 3}]}
    assert json.dumps(laid_out(value, schema)) == \
        '{"b": [{"y": 2, "x": 1}, {"x": 3}], "a": 1, "extra": true}'
    prompt = BenchPrompt("s", "structured", "x", schema=json.dumps(schema),
                         answer=json.dumps({"a": 1, "b": []}))
    assert answer_text(prompt, schema) == '{"b": [], "a": 1}'
    with pytest.raises(ConfigError, match="no 'answer'"):
        answer_text(BenchPrompt("s", "structured", "x", schema="{}"), schema)


def test_llguidance_walk_times_every_position_and_refuses_an_answer_off_the_schema():
    import llguidance

    from edgespec.bench.masks import walk_llguidance
    from edgespec.runtime.constraint import Constraint

    tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_AsciiTokenizer()))
    constraint = Constraint.json_schema(_ENUM_SCHEMA)
    row = np.zeros(len(_ASCII) + 1, np.float32)
    text = json.dumps({"pet": "dog", "ok": False, "n": 22})  # (the schema's key order)
    tokens = _AsciiTokenizer()(text)
    walk = walk_llguidance(constraint, tokenizer, len(row), tokens, row)
    assert set(walk) == {"mask", "bits", "apply", "advance"}
    assert len(walk["mask"]) == len(tokens) + 1 and len(walk["advance"]) == len(tokens)
    assert np.allclose(walk["mask"], walk["bits"] + walk["apply"]) and (walk["mask"] > 0).all()
    bad = _AsciiTokenizer()(text.replace("dog", "pig"))
    with pytest.raises(ConfigError, match=f"token {text.index('dog')} "):
        walk_llguidance(constraint, tokenizer, len(row), bad, row)


@pytest.mark.parametrize("args, message", [
    (["--structured"], "--structured is an option of --overhead"),
    (["--overhead", "--structured", "--vocab", "100"], "drop --recorded, --vocab"),
    (["--overhead", "--structured", "--only", "chat-trip"], "no prompt left"),
])
def test_structured_overhead_option_errors(args, message):
    res = CliRunner().invoke(cli, ["bench", *args])
    assert res.exit_code == 2 and message in res.output and "Traceback" not in res.output


def test_structured_overhead_needs_prompts_with_answers(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "s", "kind": "structured", "prompt": "x",
                                   "schema": _ENUM_SCHEMA}) + "\n")
    res = CliRunner().invoke(cli, ["bench", "--overhead", "--structured", "--prompts", str(prompts)])
    assert res.exit_code == 2 and "has a schema and an 'answer'" in res.output


def test_llama_cpps_tools_leave_structured_prompts_out_with_a_note(monkeypatch):
    from edgespec.core.sampling import SamplingParams

    monkeypatch.setattr(bench_cli.anchors_mod, "settings_from_engine", lambda engine, **kw: "s")
    target, draft = pair(16, n_ctx=512)
    engine = Engine(target, draft, drafter="hybrid")
    chat = BenchPrompt("c", "chat", "hello")
    structured = BenchPrompt("s", "structured", "pick", schema=json.dumps(_ENUM_SCHEMA))
    notes, said = [], []
    settings, prompts = bench_cli._anchor_plan(engine, [structured, chat], 8, {"draft_length": None},
                                               SamplingParams(), notes, said.append)
    assert settings == "s" and [p.id for p in prompts] == ["c"]
    assert notes == said and "structured prompts left out" in notes[0]
    notes.clear()
    assert bench_cli._anchor_plan(engine, [structured], 8, {"draft_length": None},
                                  SamplingParams(), notes, said.append) is None
    assert len(notes) == 1
