"""The real tiny model (SmolLM2-135M) from the fake hub: a split GGUF loads and generates, and
the draft is picked for a known target, for an unknown one with a compatible catalog draft, and
not at all when none fits (lookup drafting, said once). The catalog here is a test catalog naming
hub repositories of the fake hub."""

from __future__ import annotations

import pytest

from edgespec.models.resolve import resolve_model

from .fake_hub import FakeHub
from .gguf_split import split_gguf
from .real_util import GREEDY, ids

pytestmark = pytest.mark.real

QWEN_TOKENIZER = ('{ model = "gpt2", pre = "qwen2", bos = 151643, eos = 151645, n_tokens = 151936, '
                  'sha256 = "b9aee1f8525931c0a815aab208b413df6bb2ff5d4b818908e105b09df020d5f1" }')
CATALOG = f"""
schema = 2

[models.smol-target]
repo = "acme/SmolLM2-135M-Instruct-GGUF"
quant = "Q4_1"
params = 0.135

[models.smol-draft]
description = "the same file in another repository, with no tokenizer record: judged from its header"
repo = "acme/SmolDraft-GGUF"
quant = "Q4_1"
params = 0.13

[models.qwen-draft]
description = "a smaller draft of another tokenizer, known only by its record: never downloaded"
repo = "acme/QwenDraft-GGUF"
quant = "Q4_K_M"
params = 0.01
tokenizer = {QWEN_TOKENIZER}

[models.qwen-target]
repo = "acme/QwenTarget-GGUF"
quant = "Q4_K_M"

[pairs.smol]
target = "smol-target"
draft = "smol-draft"

[pairs.qwen]
target = "qwen-target"
draft = "qwen-draft"
"""
PROMPT = "Write a haiku about the sea."


@pytest.fixture(scope="module")
def tiny_file():
    return resolve_model("smollm2-135m-instruct-q4_1", progress=False)


@pytest.fixture(scope="module")
def split_parts(tiny_file, tmp_path_factory):
    return split_gguf(tiny_file, tmp_path_factory.mktemp("split"), 3)


@pytest.fixture
def fake_hub(tiny_file, split_parts, tmp_path, monkeypatch):
    with FakeHub() as h:
        name = tiny_file.name
        for repo in ("acme/SmolLM2-135M-Instruct-GGUF", "acme/SmolDraft-GGUF", "acme/Unknown-GGUF"):
            h.add(repo, name, path=tiny_file)
        for part in split_parts:
            h.add("acme/SmolSplit-GGUF", f"Q4_1/{part.name}", path=part)
        catalog = tmp_path / "catalog.toml"
        catalog.write_text(CATALOG)
        monkeypatch.setenv("EDGESPEC_CATALOG", str(catalog))
        h.reach(monkeypatch, tmp_path)
        yield h


def _greedy(engine, n: int = 24) -> list[int]:
    return ids(engine.complete(PROMPT, max_tokens=n, sampling=GREEDY))


@pytest.fixture(scope="module")
def plain(tiny_file):
    """The target-only greedy completion: (token ids, text)."""
    from edgespec.runtime.engine import Engine

    with Engine.load(str(tiny_file), drafter="none", n_ctx=512, progress=False) as engine:
        done = engine.complete(PROMPT, max_tokens=24, sampling=GREEDY)
        return ids(done), done.text


@pytest.fixture(scope="module")
def plain_ids(plain):
    return plain[0]


def test_split_gguf_from_the_hub_loads_and_generates(fake_hub, split_parts, plain_ids):
    from edgespec.runtime.engine import Engine

    assert len(split_parts) == 3
    with Engine.load("acme/SmolSplit-GGUF:q4_1", drafter="lookup", n_ctx=512, progress=False) as engine:
        assert engine.target.path.name == split_parts[0].name
        assert _greedy(engine) == plain_ids
    assert len(fake_hub.downloads(split_parts[2].name)) == 1  # every part was fetched


def test_draft_picked_for_a_known_target(fake_hub, plain_ids):
    from edgespec.runtime.engine import Engine

    with Engine.load("acme/SmolLM2-135M-Instruct-GGUF:Q4_1", drafter="model", n_ctx=512,
                     progress=False) as engine:
        assert engine.draft_choice.draft == "smol-draft"
        assert "the catalog pairs smol-target with it (pair 'smol')" in engine.draft_choice.reason
        assert engine.draft is not None and engine.drafter_name == "model"
        assert _greedy(engine) == plain_ids


def test_draft_picked_for_an_unknown_target_by_tokenizer(fake_hub, plain_ids, capsys):
    from edgespec.runtime.engine import Engine

    with Engine.load("acme/Unknown-GGUF:Q4_1", drafter="hybrid", n_ctx=512, progress=True) as engine:
        choice = engine.draft_choice
        assert choice.draft == "smol-draft", choice
        assert "smallest catalog draft whose tokenizer matches" in choice.reason
        assert engine.draft is not None and engine.drafter_name == "hybrid"
        assert _greedy(engine) == plain_ids
    assert "note: draft smol-draft picked" in capsys.readouterr().err
    # the draft was judged from the first bytes of its file (ranged reads), then fetched to run
    gets = fake_hub.downloads("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert any(g.get("range", "").startswith("bytes=0-") for g in gets)
    # qwen-draft, smaller but of another tokenizer, was judged from its record: never asked for
    assert not [p for _, p, _ in fake_hub.requests if "QwenDraft" in p]


def test_no_compatible_draft_means_lookup_said_once(fake_hub, tmp_path, monkeypatch, plain_ids, capsys):
    from edgespec.runtime.engine import Engine

    catalog = tmp_path / "qwen-only.toml"
    catalog.write_text(CATALOG.split("[models.qwen-target]")[0].replace(
        "[models.smol-target]", "[models.unused]").replace("[models.smol-draft]", "[models.unused2]")
        + '\n[models.qwen-target]\nrepo = "acme/QwenTarget-GGUF"\nquant = "Q4_K_M"\n'
        + '\n[pairs.qwen]\ntarget = "qwen-target"\ndraft = "qwen-draft"\n')
    monkeypatch.setenv("EDGESPEC_CATALOG", str(catalog))
    with Engine.load("acme/Unknown-GGUF:Q4_1", drafter="model", n_ctx=512, progress=True) as engine:
        assert engine.draft is None and engine.draft_choice.draft is None
        assert engine.drafter_name == "lookup"
        assert _greedy(engine) == plain_ids
    err = capsys.readouterr().err
    assert err.count("lookup drafting only") == 1 and "no catalog draft shares" in err


def test_cli_complete_with_a_hub_target_picks_its_draft(fake_hub, tmp_path, plain):
    """The README's command, against the fake hub: the draft picked by itself, said on stderr."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ}
    done = subprocess.run(
        [sys.executable, "-m", "edgespec", "complete", PROMPT, "--target", "acme/Unknown-GGUF:Q4_1",
         "--drafter", "model", "-n", "24", "--ctx", "512", "--json"],
        capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["draft_choice"]["draft"] == "smol-draft"
    assert result["draft_choice"]["reason"].startswith("the smallest catalog draft whose tokenizer")
    assert result["text"] == plain[1] and result["tokens"] == len(plain[0])
    assert result["stats"]["accepted"] > 0  # the draft really drafted
    done = subprocess.run(
        [sys.executable, "-m", "edgespec", "complete", PROMPT, "--target", "acme/SmolLM2-135M-Instruct-GGUF:Q4_1",
         "-n", "4", "--ctx", "512"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "note: draft smol-draft picked: the catalog pairs smol-target with it (pair 'smol')" in done.stderr
