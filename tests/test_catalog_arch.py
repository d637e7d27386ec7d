"""What a model is, beside its tokenizer: the catalog's ``arch`` and ``mtp`` fields (schema 3),
the shipped Qwen3.5 entries, and ``gguf_meta.arch_of`` reading a GGUF header's architecture,
whether it is hybrid (recurrent layers beside attention) and its MTP layers."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from edgespec.config import cache_dir

from edgespec.errors import ConfigError
from edgespec.models.catalog import SCHEMA_VERSION, HubEntry, ModelEntry, load_catalog
from edgespec.models.gguf_meta import (
    HYBRID_ARCHS,
    RECURRENT_ARCHS,
    ArchInfo,
    GGUFError,
    arch_kind,
    arch_of,
    read_arch,
)

from .test_gguf_meta import ARRAY, I32, STRING, U32, gguf, tokenizer_file

QWEN35_FAMILY = {"qwen35", "qwen35moe"}
#: small GGUFs of real hybrid architectures (edgespec.models.synthetic), where they were written
SYNTHETIC = sorted((cache_dir() / "models" / "synthetic").glob("synthetic-*-tiny*.gguf"))


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.delenv("EDGESPEC_CATALOG", raising=False)
    monkeypatch.setenv("EDGESPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("EDGESPEC_NO_HF", "1")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def _load(tmp_path, text: str):
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    return load_catalog(path)


HUB_MODEL = """
[models.h]
repo = "acme/H-GGUF"
quant = "Q4_K_M"
{extra}
"""

PINNED_MODEL = """
[models.p]
file = "p.gguf"
size = 10
sha256 = "{sha}"
{extra}
[[models.p.sources]]
kind = "local"
paths = ["/nowhere/p.gguf"]
""".replace("{sha}", "a" * 64)


# --------------------------------------------------------------------------- the schema


def test_arch_and_mtp_fields_on_both_kinds_of_entry(tmp_path):
    cat = _load(tmp_path, "schema = 3\n"
                + HUB_MODEL.format(extra='arch = "qwen35"\nmtp = true')
                + PINNED_MODEL.replace("{extra}", 'arch = "llama"\nmtp = false'))
    hub, pinned = cat.models["h"], cat.models["p"]
    assert isinstance(hub, HubEntry) and (hub.arch, hub.mtp, hub.hybrid) == ("qwen35", True, True)
    assert isinstance(pinned, ModelEntry) and (pinned.arch, pinned.mtp, pinned.hybrid) == ("llama", False, False)


def test_fields_are_optional_and_old_schemas_still_load(tmp_path):
    for schema in ("", "schema = 1\n", "schema = 2\n", f"schema = {SCHEMA_VERSION}\n"):
        cat = _load(tmp_path, schema + HUB_MODEL.format(extra="")
                    + PINNED_MODEL.replace("{extra}", ""))
        for entry in cat.models.values():
            assert (entry.arch, entry.mtp, entry.hybrid) == (None, None, False)
    assert SCHEMA_VERSION == 3


@pytest.mark.parametrize(
    "text, message",
    [
        ("schema = 2\n" + HUB_MODEL.format(extra='arch = "qwen35"'),
         "models.h.arch: needs schema = 3 or later (the catalog says 2)"),
        ("schema = 1\n" + HUB_MODEL.format(extra="mtp = true"),
         "models.h.mtp: needs schema = 3 or later (the catalog says 1)"),
        ("schema = 3\n" + HUB_MODEL.format(extra='arch = "Qwen 3.5"'), "models.h.arch: must be a llama.cpp architecture"),
        ("schema = 3\n" + HUB_MODEL.format(extra="arch = 35"), "models.h.arch: must be a llama.cpp architecture"),
        ("schema = 3\n" + HUB_MODEL.format(extra='arch = ""'), "models.h.arch: must be a llama.cpp architecture"),
        ("schema = 3\n" + HUB_MODEL.format(extra="mtp = 1"), "models.h.mtp: must be true or false"),
        ("schema = 3\n" + HUB_MODEL.format(extra='mtp = "yes"'), "models.h.mtp: must be true or false"),
        ("schema = 3\n" + PINNED_MODEL.replace("{extra}", "mtp = 2"), "models.p.mtp: must be true or false"),
        ("schema = 3\n" + HUB_MODEL.format(extra='hybrid = true'), "unknown key(s) hybrid"),
        ("schema = 4\n" + HUB_MODEL.format(extra=""), "unsupported schema 4 (this edgespec reads schemas 1 to 3)"),
    ],
)
def test_validation(tmp_path, text, message):
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, text)
    assert message in str(info.value)
    assert str(tmp_path / "catalog.toml") in str(info.value)


# --------------------------------------------------------------------------- the shipped Qwen3.5 entries


QWEN35_TARGETS = {
    "qwen3.5-9b-q4_k_m": ("unsloth/Qwen3.5-9B-MTP-GGUF", "Q4_K_M", "qwen35"),
    "qwen3.5-27b-q4_k_m": ("unsloth/Qwen3.5-27B-MTP-GGUF", "Q4_K_M", "qwen35"),
    "qwen3.5-35b-a3b-ud-q4_k_xl": ("unsloth/Qwen3.5-35B-A3B-MTP-GGUF", "Q4_K_XL", "qwen35moe"),
}
QWEN35_DRAFTS = {
    "qwen3.5-0.8b-q4_k_m": "unsloth/Qwen3.5-0.8B-GGUF",
    "qwen3.5-2b-q4_k_m": "unsloth/Qwen3.5-2B-GGUF",
    "qwen3.5-4b-q4_k_m": "unsloth/Qwen3.5-4B-GGUF",
}


def test_shipped_qwen35_entries():
    cat = load_catalog()
    for name, (repo, quant, arch) in QWEN35_TARGETS.items():
        entry = cat.model(name)
        assert isinstance(entry, HubEntry) and (entry.repo, entry.quant, entry.arch) == (repo, quant, arch)
        assert entry.hybrid and entry.mtp is True, name  # the MTP repositories keep Qwen's MTP layer
    for name, repo in QWEN35_DRAFTS.items():
        entry = cat.model(name)
        assert isinstance(entry, HubEntry) and (entry.repo, entry.quant, entry.arch) == (repo, "Q4_K_M", "qwen35")
        assert entry.hybrid and entry.mtp is False, name
    # drafts are tried smallest first: the 0.8B before the 2B before the 4B
    drafts = [e.name for e in cat.drafts() if e.name in QWEN35_DRAFTS]
    assert drafts == list(QWEN35_DRAFTS)
    # the entries the catalog had before keep recording nothing of their layers
    for name in ("qwen2.5-coder-1.5b-instruct-q4_k_m", "qwen3-8b-q4_k_m", "llama-3.2-1b-instruct-q4_k_m"):
        assert (cat.model(name).arch, cat.model(name).mtp) == (None, None)


def test_shipped_qwen35_pairs_stay_in_the_family():
    cat = load_catalog()
    pairs = {p.name: (p.target, p.draft) for p in cat.pairs.values() if p.name.startswith("qwen3.5")}
    assert pairs == {
        "qwen3.5-9b": ("qwen3.5-9b-q4_k_m", "qwen3.5-0.8b-q4_k_m"),
        "qwen3.5-27b": ("qwen3.5-27b-q4_k_m", "qwen3.5-2b-q4_k_m"),
        "qwen3.5-27b-4b": ("qwen3.5-27b-q4_k_m", "qwen3.5-4b-q4_k_m"),
        "qwen3.5-35b-a3b": ("qwen3.5-35b-a3b-ud-q4_k_xl", "qwen3.5-0.8b-q4_k_m"),
    }
    # One tokenizer for the whole family, another than Qwen2.5's or Qwen3's: no pair crosses.
    for pair in cat.pairs.values():
        ends = [cat.model(pair.target), cat.model(pair.draft)]
        in_family = [e.arch in QWEN35_FAMILY for e in ends]
        assert in_family[0] == in_family[1], pair.name
    assert cat.pair_for_target("qwen3.5-27b-q4_k_m").draft == "qwen3.5-2b-q4_k_m"  # the first pair


# --------------------------------------------------------------------------- gguf_meta.arch_of


def test_arch_kinds_are_llama_cpp_names():
    assert {"qwen35", "qwen35moe", "qwen3next", "lfm2", "granitehybrid", "nemotron_h", "falcon-h1",
            "jamba"} <= HYBRID_ARCHS
    assert not HYBRID_ARCHS & RECURRENT_ARCHS
    assert [arch_kind(a) for a in ("qwen35", "mamba2", "qwen2", "llama", "", None)] == [
        "hybrid", "recurrent", "attention", "attention", "attention", "attention"]
    gguf_py = pytest.importorskip("gguf")
    assert HYBRID_ARCHS | RECURRENT_ARCHS <= set(gguf_py.MODEL_ARCH_NAMES.values())


def _header(arch: str | None, *extra) -> bytes:
    kvs = [("general.architecture", STRING, arch)] if arch is not None else []
    return gguf(kvs + [("general.name", STRING, "m"), *extra,
                       ("tokenizer.ggml.tokens", ARRAY, (STRING, ["a", "b"]))])


def test_read_arch_from_headers(tmp_path):
    qwen35 = _header("qwen35", ("qwen35.block_count", U32, 25), ("qwen35.nextn_predict_layers", U32, 1))
    assert read_arch(io.BytesIO(qwen35)) == ArchInfo("qwen35", 1)
    info = read_arch(io.BytesIO(qwen35))
    assert (info.kind, info.hybrid, info.recurrent) == ("hybrid", True, False)
    assert info.describe() == "qwen35, hybrid, MTP layers: 1"
    # another architecture's MTP key is not this model's
    other = _header("lfm2", ("qwen35.nextn_predict_layers", U32, 1))
    assert read_arch(io.BytesIO(other)) == ArchInfo("lfm2", 0)
    assert read_arch(io.BytesIO(other)).describe() == "lfm2, hybrid"
    mamba = _header("mamba2")
    assert read_arch(io.BytesIO(mamba)).describe() == "mamba2, recurrent"
    plain = tokenizer_file(["x", "y"])  # a llama header, as test_gguf_meta writes one
    assert read_arch(io.BytesIO(plain)).describe() == "llama"
    assert read_arch(io.BytesIO(_header(None))) == ArchInfo("", 0)
    assert read_arch(io.BytesIO(_header(None))).describe() == "unknown architecture"
    deepseek = _header("deepseek2", ("deepseek2.nextn_predict_layers", I32, 1))  # MTP is not only hybrids'
    assert read_arch(io.BytesIO(deepseek)).describe() == "deepseek2, MTP layers: 1"
    path = tmp_path / "m.gguf"
    path.write_bytes(qwen35)
    assert arch_of(path) == ArchInfo("qwen35", 1)
    assert arch_of(str(path)).mtp_layers == 1


@pytest.mark.parametrize("data, message", [
    (b"not a gguf at all", "not a GGUF file"),
    (gguf([("general.architecture", U32, 7)]), "general.architecture is not a string"),
    (_header("qwen35", ("qwen35.nextn_predict_layers", STRING, "1")), "qwen35.nextn_predict_layers is '1'"),
    (_header("qwen35", ("qwen35.nextn_predict_layers", I32, -1)), "not a count of layers"),
    (_header("qwen35")[:-3], "truncated GGUF header"),
])
def test_read_arch_errors(data, message):
    with pytest.raises(GGUFError, match=message):
        read_arch(io.BytesIO(data))


def test_arch_of_a_file_gguf_py_writes(tmp_path):
    """gguf-py (the writer llama.cpp's converter uses) writes the keys where arch_of reads them."""
    gguf_py = pytest.importorskip("gguf")
    path = tmp_path / "qwen35moe.gguf"
    writer = gguf_py.GGUFWriter(str(path), "qwen35moe")
    writer.add_block_count(41)
    writer.add_nextn_predict_layers(1)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["a", "b", "c"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    info = arch_of(path)
    assert info == ArchInfo("qwen35moe", 1) and info.describe() == "qwen35moe, hybrid, MTP layers: 1"


@pytest.mark.skipif(not SYNTHETIC, reason="no synthetic hybrid GGUF written here (edgespec.models.synthetic)")
@pytest.mark.parametrize("path", SYNTHETIC, ids=lambda p: p.name)
def test_arch_of_agrees_with_llama_cpp(path: Path):
    """On files of real hybrid architectures: llama.cpp's own llama_model_is_hybrid/is_recurrent
    (the model loaded vocabulary only) says what HYBRID_ARCHS and RECURRENT_ARCHS say, and its
    MTP layer count is the one the file name promises."""
    import llama_cpp

    from edgespec.runtime import llama_log  # noqa: F401 (keeps llama.cpp's log quiet)

    info = arch_of(path)
    assert info.mtp_layers == (1 if "-mtp-" in path.name else 0)
    from edgespec.runtime.llama_model import model_params

    params, _, keep = model_params()  # (not an RPC worker an earlier test left registered)
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    assert model, f"llama.cpp cannot load {path}"
    try:
        assert (info.hybrid, info.recurrent) == (llama_cpp.llama_model_is_hybrid(model),
                                                 llama_cpp.llama_model_is_recurrent(model))
    finally:
        llama_cpp.llama_model_free(model)
