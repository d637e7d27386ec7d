"""LoadOptions (edgespec/runtime/options.py): the one record every face loads an engine from,
checked and filled in when made; and the rules that engine, command line and server share
(draft length, one constraint at most, the tool-call finish reason)."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, replace
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from edgespec import config
from edgespec.cli.options import make_constraint, model_options
from edgespec.errors import ConfigError
from edgespec.runtime import backend
from edgespec.runtime.engine import Engine
from edgespec.runtime.options import (
    TOOL_CHOICE,
    ConstraintConflict,
    LoadOptions,
    one_constraint,
    validate_draft_length,
)
from edgespec.runtime.tools import call_finish_reason
from edgespec.server.errors import APIError
from edgespec.server.schemas import CompletionRequest, Defaults, parse_body, to_generation

WORKER, OTHER = "10.0.0.2:50052", "10.0.0.3:50052"


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(backend, "gpu_offload_supported", lambda: False)


# ---- defaults filled in ----------------------------------------------------------------------


def test_the_defaults_are_filled_in(no_gpu):
    o = LoadOptions()
    assert o.n_threads == config.default_threads()
    assert (o.n_gpu_layers, o.draft_n_gpu_layers) == (0, 0)
    assert (o.rpc, o.draft_rpc, o.tensor_split, o.fixed_width) == ((), (), (), 0)
    assert (o.drafter, o.draft_length, o.pair) == (config.DEFAULT_DRAFTER, None, config.DEFAULT_PAIR)


@pytest.mark.parametrize("kwargs, ngl, draft_ngl", [
    (dict(rpc=WORKER), -1, 0),  # the target on workers: all its layers there, the draft here
    (dict(draft_rpc=WORKER), 0, -1),
    (dict(rpc=WORKER, draft_rpc=OTHER), -1, -1),
    (dict(n_gpu_layers=12), 12, 12),  # a local GPU: the draft as the target
    (dict(rpc=WORKER, n_gpu_layers=5), 5, 0),
    (dict(n_gpu_layers=12, draft_n_gpu_layers=3), 12, 3),
])
def test_offloaded_layers_follow_the_workers(no_gpu, kwargs, ngl, draft_ngl):
    o = LoadOptions(**kwargs)
    assert (o.n_gpu_layers, o.draft_n_gpu_layers) == (ngl, draft_ngl)


def test_endpoints_and_split_become_tuples():
    o = LoadOptions(rpc=f"{WORKER}, {OTHER},{WORKER}", draft_rpc=[OTHER], tensor_split="3,1")
    assert o.rpc == (WORKER, OTHER) and o.draft_rpc == (OTHER,) and o.tensor_split == (3.0, 1.0)
    assert LoadOptions(target=Path("/m/t.gguf"), draft=Path("d.gguf")).target == "/m/t.gguf"


def test_exact_fills_in_the_fixed_width(no_gpu, monkeypatch):
    assert LoadOptions(exact=True).fixed_width == 0  # this CPU's pieces are exact already
    assert LoadOptions(exact=True, rpc=WORKER).fixed_width == config.EXACT_FIXED_WIDTH
    assert LoadOptions(exact=True, rpc=WORKER, fixed_width=16).fixed_width == 16
    assert LoadOptions(rpc=WORKER).fixed_width == 0  # not asked: not exact
    monkeypatch.setattr(backend, "gpu_offload_supported", lambda: True)
    assert LoadOptions(exact=True, n_gpu_layers=-1).fixed_width == config.EXACT_FIXED_WIDTH


def test_a_filled_record_rebuilds_equal(no_gpu):
    o = LoadOptions(target="t.gguf", rpc=WORKER, tensor_split=[1, 1], exact=True, n_threads=3)
    assert replace(o) == o and LoadOptions(**asdict(o)) == o
    assert replace(o, drafter="none").drafter == "none"
    with pytest.raises(ConfigError, match="draft length"):  # replace() checks too
        replace(o, draft_length=99)


# ---- each rule's message ----------------------------------------------------------------------

BAD = [
    (dict(drafter="magic"), "unknown drafter 'magic': choose one of "),
    (dict(draft_length=-1), "draft length must be an integer in [0, 64], got -1"),
    (dict(draft_length=65), "draft length must be an integer in [0, 64], got 65"),
    (dict(draft_length=True), "draft length must be an integer in [0, 64], got True"),
    (dict(draft_length=2.0), "draft length must be an integer in [0, 64], got 2.0"),
    (dict(draft_window=-1), "draft_window must be an integer >= 0 (0 = the whole row), got -1"),
    (dict(draft_window="64"), "draft_window must be an integer >= 0 (0 = the whole row), got '64'"),
    (dict(max_ngram=3, min_ngram=5), "n-gram sizes must satisfy 1 <= min (5) <= max (3)"),
    (dict(n_threads=0), "threads must be >= 1, got 0"),
    (dict(n_ctx=8), "context size must be >= 16 tokens, got 8"),
    (dict(rpc_timeout=0), "RPC timeout must be > 0 seconds, got 0"),
    (dict(rpc="nowhere"), "RPC endpoint 'nowhere' is not HOST:PORT"),
    (dict(tensor_split="3,x"), "tensor split '3,x' is not a list of numbers like 3,1"),
    (dict(tensor_split="0,0"), "tensor split '0,0': weights must be >= 0, one of them > 0"),
    (dict(exact=True, batch_consistent=False),
     "exact decoding and fast kernels contradict each other: choose one"),
]


@pytest.mark.parametrize("kwargs, message", BAD, ids=[m[:40] for _, m in BAD])
def test_each_bad_value_is_one_config_error(kwargs, message):
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        LoadOptions(**kwargs)


@pytest.mark.parametrize("kwargs, message", BAD[:4] + BAD[8:10], ids=[m[:40] for _, m in BAD[:4] + BAD[8:10]])
def test_engine_load_checks_through_the_record_before_any_model_is_looked_for(kwargs, message,
                                                                              monkeypatch):
    def no_looking(*args, **kw):
        raise AssertionError("a model was looked for")

    monkeypatch.setattr("edgespec.models.resolve.resolve_model", no_looking)
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        Engine.load("/nonexistent/model.gguf", **kwargs, download=False, progress=False)


# ---- the command line's dict ------------------------------------------------------------------


def _click_opts(*args: str) -> dict:
    """The dict the shared model options give a command for ``args``."""
    seen = {}

    @click.command()
    @model_options
    def command(**opts):
        seen.update(opts)

    result = CliRunner().invoke(command, list(args), standalone_mode=False)
    assert result.exception is None, result.output
    return seen


def test_from_cli_reads_clicks_dict(no_gpu):
    opts = _click_opts("--target", "t.gguf", "--draft", "d.gguf", "--drafter", "model", "-k", "6",
                       "--max-ngram", "5", "--min-ngram", "3", "--draft-window", "8",
                       "--ngl", "4", "--draft-ngl", "2", "--rpc", WORKER, "--draft-rpc", OTHER,
                       "--tensor-split", "2,1", "--rpc-timeout", "9", "-t", "3", "--ctx", "512",
                       "--fast-kernels", "--fixed-width", "4", "--verbose")
    assert LoadOptions.from_cli(opts) == LoadOptions(
        target="t.gguf", draft="d.gguf", drafter="model", draft_length=6, max_ngram=5,
        min_ngram=3, draft_window=8, n_gpu_layers=4, draft_n_gpu_layers=2, rpc=(WORKER,),
        draft_rpc=(OTHER,), tensor_split=(2.0, 1.0), rpc_timeout=9.0, n_threads=3, n_ctx=512,
        batch_consistent=False, fixed_width=4)


def test_from_cli_defaults_equal_the_records(no_gpu):
    opts = _click_opts()
    assert LoadOptions.from_cli(opts) == LoadOptions()
    assert LoadOptions.from_cli(dict(opts, exact=True)).exact
    del opts["exact"]  # (a dict made without --exact)
    assert not LoadOptions.from_cli(opts).exact


def test_the_draft_length_option_says_the_validators_words():
    @click.command()
    @model_options
    def command(**opts):
        pass

    result = CliRunner().invoke(command, ["-k", "65"])
    assert result.exit_code == 2
    assert "--draft-length" in result.output
    assert "draft length must be an integer in [0, 64], got 65" in result.output


# ---- the record passed whole ------------------------------------------------------------------


def test_each_models_options_come_from_the_record(no_gpu):
    o = LoadOptions(rpc=WORKER, tensor_split="1,1", n_threads=2, n_ctx=256, exact=True)
    t = o.target_options(Path("t.gguf"))
    assert (t.path, t.n_gpu_layers, t.n_threads, t.n_ctx, t.rpc, t.tensor_split) == (
        Path("t.gguf"), -1, 2, 256, (WORKER,), (1.0, 1.0))
    assert (t.batch_consistent, t.fixed_width, t.repack) == (True, config.EXACT_FIXED_WIDTH, False)
    d = o.draft_options(Path("d.gguf"), same_file=False)
    assert (d.n_gpu_layers, d.rpc, d.tensor_split, d.repack) == (0, (), (), True)
    assert (d.batch_consistent, d.fixed_width) == (False, 0)  # the draft keeps the fast kernels
    same = o.draft_options(Path("t.gguf"), same_file=True)
    assert (same.batch_consistent, same.fixed_width) == (True, config.EXACT_FIXED_WIDTH)


class _Loaded(Exception):
    pass


def _capture_load(monkeypatch, **load) -> list:
    """The ModelOptions ``Engine.load(**load)`` hands the backend (it stops there)."""
    seen = []

    def backend_of(options):
        seen.append(options)
        raise _Loaded

    monkeypatch.setattr("edgespec.models.resolve.resolve_model",
                        lambda name, **kw: Path(name))
    monkeypatch.setattr(backend, "LlamaBackend", backend_of)
    with pytest.raises(_Loaded):
        Engine.load(**load, progress=False)
    return seen


def test_engine_load_hands_the_backend_the_records_options(no_gpu, monkeypatch):
    record = LoadOptions(target="t.gguf", drafter="none", n_ctx=256, rpc=WORKER, n_threads=2)
    assert _capture_load(monkeypatch, options=record) == [record.target_options(Path("t.gguf"))]
    by_keywords = _capture_load(monkeypatch, target="t.gguf", drafter="none", n_ctx=256,
                                rpc=WORKER, n_threads=2)
    assert by_keywords == [record.target_options(Path("t.gguf"))]
    positional = _capture_load(monkeypatch, target="other.gguf", options=record)
    assert positional[0].path == Path("other.gguf")


def test_engine_load_takes_a_record_or_keywords_not_both():
    with pytest.raises(TypeError, match="not both: n_ctx"):
        Engine.load(options=LoadOptions(drafter="none"), n_ctx=256, progress=False)
    with pytest.raises(TypeError):
        Engine.load("/nonexistent/model.gguf", no_such_option=1, progress=False)


# ---- rules the faces share --------------------------------------------------------------------


def test_one_constraint_at_most():
    assert one_constraint([("a", None), ("b", None)]) is None
    assert one_constraint([("a", None), ("b", 2), (TOOL_CHOICE, None)]) == ("b", 2)
    with pytest.raises(ConstraintConflict) as info:
        one_constraint([("a", 1), ("b", None), ("c", 3), (TOOL_CHOICE, None)])
    assert str(info.value) == "give one of a, b and c, not a and c (one constraint at most)"
    assert info.value.name == "c"
    with pytest.raises(ConstraintConflict) as info:
        one_constraint([("a", None), ("b", 2), (TOOL_CHOICE, "required")])
    assert str(info.value) == "a tool_choice that requires a call cannot be combined with b"
    assert info.value.name == TOOL_CHOICE


def test_every_face_says_one_constraint_in_the_same_words():
    with pytest.raises(ConfigError, match=re.escape(
            "give one of --schema, --json-object and --grammar, not --schema and --json-object "
            "(one constraint at most)")):
        make_constraint(dict(schema="no-such-file.json", json_object=True, grammar=None))
    from edgespec.runtime.engine import make_constraint as engine_constraint

    with pytest.raises(ConfigError, match=re.escape(
            "give one of constraint, json_schema, json_object and grammar, not json_schema and "
            "grammar (one constraint at most)")):
        engine_constraint(json_schema={}, grammar='root ::= "a"')


def test_the_server_checks_draft_length_with_the_same_validator():
    body = json.dumps({"prompt": "x", "draft_length": 65}).encode()
    with pytest.raises(APIError) as info:
        to_generation(parse_body(CompletionRequest, body), Defaults())
    with pytest.raises(ConfigError) as ours:
        validate_draft_length(65)
    assert (info.value.param, info.value.message) == ("draft_length", str(ours.value))


@pytest.mark.parametrize("reason, called, expected", [
    ("stop", True, "tool_calls"), ("length", True, "length"), ("stop", False, "stop"),
    ("context", True, "context"),
])
def test_the_tool_call_finish_reason(reason, called, expected):
    assert call_finish_reason(reason, called) == expected
