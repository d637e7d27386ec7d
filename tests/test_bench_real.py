"""``edgespec bench`` on the real tiny SmolLM2-135M model: the command end to end (edgespec and
llama-cpp-python's reference path), and the memory scenario's subprocesses. Speeds are printed,
never asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgespec.bench.memory import (
    kv_cache_bytes,
    read_gguf_metadata,
    run_memory_scenario,
)

pytestmark = pytest.mark.real

PROMPTS = ("edit-rename", "code-lru-cache", "chat-trip")  # one of each kind; chat-trip has a system message
CONFIGS = ("none", "lookup", "llama-cpp-python")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("edgespec")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ))


@pytest.fixture(scope="module")
def tiny_path():
    from edgespec.models.catalog import resolve_pair
    from edgespec.models.resolve import resolve_model

    return resolve_model(resolve_pair("tiny").target, progress=False)


def test_bench_runs_every_prompt_and_drafter_and_writes_table_json_and_plot(tmp_path):
    out = tmp_path / "results.json"
    only = [a for p in PROMPTS for a in ("--only", p)]
    res = run_cli("bench", "--pair", "tiny", "-n", "8", "--repeats", "1",
                  "--drafters", ",".join(CONFIGS), *only, "--json", str(out))
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    print(res.stdout)
    for word in ("x none", "overall", *PROMPTS, *CONFIGS):
        assert word in res.stdout
    doc = json.loads(out.read_text())
    assert doc["complete"] and doc["settings"]["prompt_ids"] == list(PROMPTS)
    assert sorted((r["prompt"], r["config"]) for r in doc["runs"]) == \
        sorted((p, c) for p in PROMPTS for c in CONFIGS)
    for r in doc["runs"]:
        assert 0 < r["generated"] <= 8 and r["tokens_per_second"] > 0, r
        assert r["rounds"] >= 1 and r["time"]["llama"] is not None
    # llama-cpp-python renders the same chat template: the same prompt, token for token in length
    for p in PROMPTS:
        lengths = {r["prompt_tokens"] for r in doc["runs"] if r["prompt"] == p}
        assert len(lengths) == 1, (p, lengths)
    assert doc["machine"]["llama_cpp_system_info"] and doc["machine"]["target"]["kernels"]
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"


def test_kv_cache_size_from_the_gguf_metadata(tiny_path):
    meta = read_gguf_metadata(tiny_path)
    assert meta["general.architecture"] == "llama" and meta["llama.block_count"] == 30
    # 30 layers x 3 KV heads x (64 + 64) values per cell, f16
    assert kv_cache_bytes(meta, 4096) == 30 * 3 * 128 * 4096 * 2


def test_memory_scenario_runs_each_side_in_a_fresh_process(tiny_path):
    result = run_memory_scenario(target=tiny_path, draft=None,
                                 sides=("edgespec-none", "llama-cpp-python"), n_ctx=512,
                                 prompt_tokens=300, max_tokens=4, threads=2)
    sides = {s["side"]: s for s in result["sides"]}
    assert set(sides) == {"edgespec-none", "llama-cpp-python"}
    for s in sides.values():
        assert "error" not in s, s
        assert 280 <= s["prompt_tokens"] <= 301 and s["generated"] >= 1
        assert s["peak_rss_mb"] > 0 and s["bound_mb"] == pytest.approx(s["files_mb"] + s["kv_mb"] + 300)
        assert isinstance(s["within_bound"], bool)
    assert abs(sides["edgespec-none"]["prompt_tokens"] - sides["llama-cpp-python"]["prompt_tokens"]) <= 1
    assert sides["llama-cpp-python"]["logits_all"] is True


#: a schema that leaves the model a few choices, and an answer well within the tokens given
PET_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["pet", "ok", "n"],
              "properties": {"pet": {"enum": ["cat", "dog"]}, "ok": {"type": "boolean"},
                             "n": {"enum": [1, 22, 333]}}}


def test_bench_answers_structured_prompts_under_their_schema_on_both_sides(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "pet", "kind": "structured", "max_tokens": 48,
                                   "prompt": "Which pet do you like, is it ok, and a number? JSON.",
                                   "schema": PET_SCHEMA}) + "\n")
    out = tmp_path / "results.json"
    res = run_cli("bench", "--pair", "tiny", "--prompts", str(prompts), "--repeats", "1",
                  "--no-warmup", "--drafters", "none,lookup,llama-cpp-python-plain",
                  "--json", str(out))
    assert res.returncode == 0, res.stderr
    print(res.stdout)
    doc = json.loads(out.read_text())
    runs = {r["config"]: r for r in doc["runs"]}
    assert set(runs) == {"none", "lookup", "llama-cpp-python-plain"}
    for config, r in runs.items():
        assert r["valid"] is True, (config, r["invalid"], r["detail"]["text"])
        assert r["finish_reason"] == "stop"
        assert json.loads(r["detail"]["text"])["pet"] in ("cat", "dog")
    assert runs["none"]["forced"] == 0 and runs["llama-cpp-python-plain"]["forced"] is None
    # the keys and punctuation: drafted by the grammar alone, every one accepted
    forced = runs["lookup"]["detail"]["stats"]["by_drafter"]["forced"]
    assert runs["lookup"]["forced"] == forced["accepted"] == forced["drafted"] >= 8
    # edgespec lays JSON out in one way: greedy, with and without drafts, the same answer
    assert runs["none"]["detail"]["text"] == runs["lookup"]["detail"]["text"]
    assert "valid" in res.stdout and "forced" in res.stdout


def test_overhead_structured_walks_both_masks_along_an_answer(tmp_path):
    out = tmp_path / "masks.json"
    res = run_cli("bench", "--overhead", "--structured", "--pair", "tiny",
                  "--only", "structured-tool-call", "-r", "1", "--json", str(out))
    assert res.returncode == 0, res.stderr
    print(res.stdout)
    doc = json.loads(out.read_text())["structured_overhead"]
    assert doc["vocab"] == 49152 and doc["repeats"] == 1
    [entry] = doc["prompts"]
    assert entry["prompt"] == "structured-tool-call" and entry["tokens"] > 60
    assert set(entry["llguidance"]) == {"mask", "bits", "apply", "advance"}
    assert set(entry["llama_cpp_grammar"]) == {"mask", "advance"}
    for method in ("llguidance", "llama_cpp_grammar"):
        for part in entry[method].values():
            assert 0 < part["median"] <= part["p90"] and part["mean"] > 0
    assert doc["all"]["tokens"] == entry["tokens"]
    assert "llguidance mask (bits + apply)" in res.stdout
    assert "llama.cpp grammar mask (apply)" in res.stdout


def test_grammar_walk_refuses_an_answer_off_the_schema(tiny_path):
    import numpy as np
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    from edgespec.bench.masks import Vocabulary, walk_grammar
    from edgespec.errors import ConfigError

    gbnf = json_schema_to_gbnf(json.dumps(PET_SCHEMA))
    with Vocabulary(tiny_path) as vocabulary:
        row = np.zeros(vocabulary.n_vocab, np.float32)
        good = vocabulary.tokenize('{"pet": "dog", "ok": true, "n": 333}')
        walk = walk_grammar(vocabulary, gbnf, good, row)
        assert len(walk["mask"]) == len(good) + 1 and len(walk["advance"]) == len(good)
        with pytest.raises(ConfigError, match="not allowed by llama.cpp's grammar"):
            walk_grammar(vocabulary, gbnf, vocabulary.tokenize('{"pet": "cow"}'), row)
