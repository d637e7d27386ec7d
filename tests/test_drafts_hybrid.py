"""Drafts for the hybrid Qwen3.5 family, with the shipped catalog: its repositories served by a
fake hub, each GGUF a small synthetic header. Qwen3.5's tokenizer is one for the family and not
Qwen2.5's (here as there: the same first token texts, and many more of them), so a Qwen3.5 target
is drafted by a Qwen3.5 model and a Qwen2.5 one never is; a target that carries MTP layers is
told it can draft with those (``--drafter mtp``) instead of a second model."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgespec.models.drafts import DraftChoice, choose_draft, judge_all, mtp_note
from edgespec.models.gguf_meta import ArchInfo

from .fake_hub import FakeHub
from .test_gguf_meta import ARRAY, STRING, U32, gguf

QWEN25 = [f"q{i}" for i in range(300)]
#: Qwen3.5's vocabulary extends Qwen2.5's texts by ~96k tokens (248320 vs 151936): here by 200,
#: more than the 128 by which a draft's vocabulary may differ from its target's.
QWEN35 = QWEN25 + [f"n{i}" for i in range(200)]
QWEN3 = [f"w{i}" for i in range(300)]
LLAMA = [f"l{i}" for i in range(300)]
LFM2 = [f"f{i}" for i in range(400)]


def header(arch: str, tokens: list[str], *, mtp: int = 0, bos: int = 1, eos: int = 2) -> bytes:
    kvs = [("general.architecture", STRING, arch), (f"{arch}.block_count", U32, 4)]
    if mtp:
        kvs.append((f"{arch}.nextn_predict_layers", U32, mtp))
    return gguf(kvs + [("tokenizer.ggml.model", STRING, "gpt2"),
                       ("tokenizer.ggml.pre", STRING, arch),
                       ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
                       ("tokenizer.ggml.bos_token_id", U32, bos),
                       ("tokenizer.ggml.eos_token_id", U32, eos)])


#: repository -> (file, header) for the shipped catalog's hub models used here
HUB = {
    "Qwen/Qwen2.5-0.5B-Instruct-GGUF": ("qwen2.5-0.5b-instruct-q4_k_m.gguf", header("qwen2", QWEN25)),
    "Qwen/Qwen2.5-7B-Instruct-GGUF": ("qwen2.5-7b-instruct-q4_k_m.gguf", header("qwen2", QWEN25)),
    "Qwen/Qwen3-0.6B-GGUF": ("Qwen3-0.6B-Q8_0.gguf", header("qwen3", QWEN3)),
    "bartowski/Llama-3.2-1B-Instruct-GGUF": ("Llama-3.2-1B-Instruct-Q4_K_M.gguf", header("llama", LLAMA)),
    "unsloth/Qwen3.5-0.8B-GGUF": ("Qwen3.5-0.8B-Q4_K_M.gguf", header("qwen35", QWEN35)),
    "unsloth/Qwen3.5-2B-GGUF": ("Qwen3.5-2B-Q4_K_M.gguf", header("qwen35", QWEN35)),
    "unsloth/Qwen3.5-4B-GGUF": ("Qwen3.5-4B-Q4_K_M.gguf", header("qwen35", QWEN35)),
    "unsloth/Qwen3.5-9B-MTP-GGUF": ("Qwen3.5-9B-Q4_K_M.gguf", header("qwen35", QWEN35, mtp=1)),
    "unsloth/Qwen3.5-27B-MTP-GGUF": ("Qwen3.5-27B-Q4_K_M.gguf", header("qwen35", QWEN35, mtp=1)),
}


@pytest.fixture
def family_hub(tmp_path, monkeypatch):
    """The shipped catalog, its hub repositories on a fake hub, nothing cached, no home models."""
    monkeypatch.delenv("EDGESPEC_CATALOG", raising=False)
    monkeypatch.delenv("EDGESPEC_MODELS_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with FakeHub() as h:
        for repo, (name, data) in HUB.items():
            h.add(repo, name, data=data)
            if repo.startswith("unsloth/"):
                h.add(repo, "mmproj-F16.gguf", data=b"GGUF vision projector, never the model")
        h.reach(monkeypatch, tmp_path)
        yield h


def local(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_a_qwen35_target_is_drafted_within_its_family(family_hub, tmp_path):
    target = local(tmp_path, "my-qwen3.5-finetune.gguf", header("qwen35", QWEN35, mtp=1))
    choice = choose_draft(str(target), target)
    assert choice.draft == "qwen3.5-0.8b-q4_k_m"
    assert choice.reason == (f"the smallest catalog draft whose tokenizer matches {target}'s "
                             "(gpt2/qwen35, 500 tokens)")
    rows = dict(judge_all(str(target), target)[1])
    assert rows == {
        "smollm2-135m-instruct-q4_1": "vocabulary sizes differ (500 vs 49152)",
        "qwen2.5-coder-0.5b-instruct-q4_k_m": "vocabulary sizes differ (500 vs 151936)",
        "qwen2.5-0.5b-instruct-q4_k_m": "vocabulary sizes differ (500 vs 300)",
        "qwen3-0.6b-q8_0": "vocabulary sizes differ (500 vs 300)",
        "qwen3.5-0.8b-q4_k_m": None,
        "llama-3.2-1b-instruct-q4_k_m": "vocabulary sizes differ (500 vs 300)",
        "qwen3.5-2b-q4_k_m": None,
        "qwen3.5-4b-q4_k_m": None,
    }


def test_a_qwen25_target_never_gets_a_qwen35_draft(family_hub, tmp_path):
    target = local(tmp_path, "qwen2.5-finetune.gguf", header("qwen2", QWEN25))
    assert choose_draft(str(target), target).draft == "qwen2.5-0.5b-instruct-q4_k_m"
    rows = dict(judge_all(str(target), target)[1])
    assert rows["qwen2.5-0.5b-instruct-q4_k_m"] is None
    for name in ("qwen3.5-0.8b-q4_k_m", "qwen3.5-2b-q4_k_m", "qwen3.5-4b-q4_k_m"):
        assert rows[name] == "vocabulary sizes differ (300 vs 500)", name


def test_known_qwen35_targets_get_their_pair_however_named(family_hub, tmp_path):
    target = local(tmp_path, "any.gguf", header("qwen35", QWEN35, mtp=1))
    for name, draft, pair in [
        ("qwen3.5-9b-q4_k_m", "qwen3.5-0.8b-q4_k_m", "qwen3.5-9b"),
        ("unsloth/Qwen3.5-9B-MTP-GGUF", "qwen3.5-0.8b-q4_k_m", "qwen3.5-9b"),
        ("unsloth/qwen3.5-27b-mtp-gguf:q4_k_m", "qwen3.5-2b-q4_k_m", "qwen3.5-27b"),
        ("unsloth/Qwen3.5-35B-A3B-MTP-GGUF:Q4_K_XL", "qwen3.5-0.8b-q4_k_m", "qwen3.5-35b-a3b"),
    ]:
        choice = choose_draft(name, target)
        assert choice.draft == draft, name
        assert choice.reason.endswith(f"(pair '{pair}')"), name


def test_mtp_note():
    qwen35 = ArchInfo("qwen35", 1)
    picked = DraftChoice("qwen3.5-0.8b-q4_k_m", "why")
    assert mtp_note("t", qwen35, picked) == (
        "t carries 1 MTP layer: `--drafter mtp` drafts with the model's own layers (no second model); "
        "the alternative is the draft model qwen3.5-0.8b-q4_k_m (same tokenizer, `--drafter model`)")
    assert mtp_note("t", ArchInfo("deepseek2", 3), DraftChoice(None, "why")) == (
        "t carries 3 MTP layers: `--drafter mtp` drafts with the model's own layers (no second model); "
        "no catalog draft model shares its tokenizer")
    assert mtp_note("t", ArchInfo("qwen35", 0), picked) is None
    assert mtp_note("t", ArchInfo("qwen2"), picked) is None
