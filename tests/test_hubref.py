"""Hub references and the choice of GGUF files in a listing: pure functions, no network."""

from __future__ import annotations

import pytest

from edgespec.errors import ModelError
from edgespec.models.catalog import hub_ref_of, looks_like_path
from edgespec.models.hubref import HubFile, HubRef, parse_ref, pick_files, quant_of


@pytest.mark.parametrize("text, ref", [
    ("Qwen/Qwen2.5-Coder-7B-Instruct-GGUF:Q4_K_M", HubRef("Qwen/Qwen2.5-Coder-7B-Instruct-GGUF", "Q4_K_M")),
    ("Qwen/Qwen2.5-Coder-7B-Instruct-GGUF:q8_0", HubRef("Qwen/Qwen2.5-Coder-7B-Instruct-GGUF", "q8_0")),
    ("bartowski/Llama-3.2-1B-Instruct-GGUF", HubRef("bartowski/Llama-3.2-1B-Instruct-GGUF")),
    ("owner/repo/model-Q4_K_M.gguf", HubRef("owner/repo", filename="model-Q4_K_M.gguf")),
    ("owner/repo/Q4_K_M/model-00001-of-00002.gguf",
     HubRef("owner/repo", filename="Q4_K_M/model-00001-of-00002.gguf")),
    ("hf.co/owner/repo:IQ4_XS", HubRef("owner/repo", "IQ4_XS")),
    ("https://huggingface.co/owner/repo", HubRef("owner/repo")),
])
def test_parse_ref(text, ref):
    assert parse_ref(text) == ref


@pytest.mark.parametrize("text", [
    "qwen2.5-coder-1.5b-instruct-q4_k_m",  # a catalog name
    "model.gguf", "dir/model.gguf", "./a/b/c.gguf", "/abs/a/b.gguf", "~/models/a/b.gguf",
    "owner/repo/", "owner/repo:Q4:K", "a/b/c",  # a directory-like path is not a file reference
])
def test_not_a_ref(text):
    assert parse_ref(text) is None


def test_an_existing_file_is_a_path_even_when_shaped_like_a_ref(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "owner" / "repo").mkdir(parents=True)
    (tmp_path / "owner" / "repo" / "m.gguf").write_bytes(b"GGUF")
    assert hub_ref_of("owner/repo/m.gguf") is None and looks_like_path("owner/repo/m.gguf")
    assert hub_ref_of("owner/other/m.gguf") == HubRef("owner/other", filename="m.gguf")
    assert not looks_like_path("owner/other/m.gguf")


@pytest.mark.parametrize("name, quant", [
    ("qwen2.5-coder-7b-instruct-q4_k_m.gguf", "Q4_K_M"),
    ("Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf", "Q4_K_M"),
    ("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1"),
    ("qwen2.5-14b-instruct-q4_k_m-00002-of-00003.gguf", "Q4_K_M"),
    ("Qwen3-0.6B-Q8_0.gguf", "Q8_0"),
    ("model-IQ4_XS.gguf", "IQ4_XS"),
    ("model-bf16.gguf", "BF16"),
    ("model.gguf", None),
])
def test_quant_of(name, quant):
    assert quant_of(name) == quant


def _files(*names: str) -> list[HubFile]:
    return [HubFile(n, 10, "0" * 64) for n in names]


LISTING = _files("README.md", "m-Q4_K_M.gguf", "m-Q4_K_S.gguf", "m-Q8_0.gguf", "m-IQ4_XS.gguf",
                 "mmproj-m-f16.gguf", "big/m-Q6_K-00002-of-00002.gguf", "big/m-Q6_K-00001-of-00002.gguf")


def test_pick_default_quant_and_case_insensitive():
    assert [f.path for f in pick_files(HubRef("o/r"), LISTING)] == ["m-Q4_K_M.gguf"]
    assert [f.path for f in pick_files(HubRef("o/r", "q8_0"), LISTING)] == ["m-Q8_0.gguf"]
    # Q4_K is a quant of its own, not a prefix of Q4_K_M/Q4_K_S; IQ4_XS is not Q4_XS
    with pytest.raises(ModelError, match="no Q4_K GGUF; it has: .*Q4_K_M.*Q4_K_S"):
        pick_files(HubRef("o/r", "Q4_K"), LISTING)


def test_pick_split_gives_every_part_in_order():
    assert [f.path for f in pick_files(HubRef("o/r", "Q6_K"), LISTING)] == [
        "big/m-Q6_K-00001-of-00002.gguf", "big/m-Q6_K-00002-of-00002.gguf"]
    # naming any part names the whole model
    got = pick_files(HubRef("o/r", filename="big/m-Q6_K-00002-of-00002.gguf"), LISTING)
    assert [f.path for f in got][0] == "big/m-Q6_K-00001-of-00002.gguf" and len(got) == 2


def test_pick_incomplete_split_is_refused():
    with pytest.raises(ModelError, match=r"incomplete: has parts \[1, 3\] of 3"):
        pick_files(HubRef("o/r"), _files("m-Q4_K_M-00001-of-00003.gguf", "m-Q4_K_M-00003-of-00003.gguf"))


def test_missing_quant_lists_the_ones_there():
    with pytest.raises(ModelError) as err:
        pick_files(HubRef("o/r", "Q5_K_M"), LISTING)
    msg = str(err.value)
    assert "o/r has no Q5_K_M GGUF; it has: IQ4_XS, Q4_K_M, Q4_K_S, Q6_K, Q8_0" in msg
    assert "F16" not in msg  # the vision projector is not a model to pick


def test_only_gguf_is_the_default_whatever_its_quant():
    assert [f.path for f in pick_files(HubRef("o/r"), _files("x-Q8_0.gguf", "README.md"))] == ["x-Q8_0.gguf"]
    with pytest.raises(ModelError, match="no Q4_K_M GGUF; it has: Q5_K_M, Q8_0"):
        pick_files(HubRef("o/r"), _files("x-Q8_0.gguf", "x-Q5_K_M.gguf"))


def test_no_gguf_and_unknown_file():
    with pytest.raises(ModelError, match="o/r has no GGUF file"):
        pick_files(HubRef("o/r"), _files("model.safetensors"))
    with pytest.raises(ModelError, match="has no file nope.gguf; its GGUF files: m-Q4_K_M.gguf"):
        pick_files(HubRef("o/r", filename="nope.gguf"), LISTING)
    assert pick_files(HubRef("o/r", filename="M-q8_0.GGUF"), LISTING)[0].path == "m-Q8_0.gguf"


def test_a_quant_found_twice_takes_one_file_over_parts_then_the_shortest_and_says_so():
    said = []
    twice = _files("x-Q4_K_M-00001-of-00002.gguf", "x-Q4_K_M-00002-of-00002.gguf", "x-Q4_K_M.gguf",
                   "x-Q4_K_M-imatrix.gguf")
    assert [f.path for f in pick_files(HubRef("o/r"), twice, on_choice=said.append)] == ["x-Q4_K_M.gguf"]
    assert said == ["o/r has 3 Q4_K_M GGUFs: x-Q4_K_M.gguf, x-Q4_K_M-imatrix.gguf, "
                    "x-Q4_K_M-*-of-00002.gguf; took x-Q4_K_M.gguf (name another as o/r/FILE.gguf)"]
    one = [f.path for f in pick_files(HubRef("o/r"), _files("a-Q4_K_M.gguf", "b-Q4_K_M.gguf"))]
    assert one == ["a-Q4_K_M.gguf"]
