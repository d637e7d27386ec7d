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
