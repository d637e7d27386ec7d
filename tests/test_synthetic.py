"""edgespec.models.synthetic: GGUFs with random weights of real hybrid architectures.

The presets' arithmetic runs anywhere; writing a file needs gguf-py and the Qwen2.5 GGUF whose
tokenizer the files carry, and loading one needs llama.cpp: those tests are ``real``. The tiny
files come from :func:`synthetic.cached` (written once per machine, a second each).
"""

from __future__ import annotations

import dataclasses
import filecmp
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from edgespec.models import synthetic
from edgespec.models.gguf_meta import read_metadata
from edgespec.models.synthetic import SHAPES

TINY = [("qwen35-tiny", False), ("qwen35-tiny", True), ("lfm2-tiny", False)]
PROMPT = b"def fibonacci(n):\n    "


# --------------------------------------------------------------------------- presets (pure)


def test_presets_are_the_promised_names():
    assert {"qwen35-tiny", "lfm2-tiny", "qwen35-0.8b", "qwen35-2b", "qwen35-9b",
            "lfm2-1.2b"} <= set(SHAPES)
    assert all(name == shape.name for name, shape in SHAPES.items())


@pytest.mark.parametrize("name", ["qwen35-tiny", "lfm2-tiny"])
def test_tiny_shapes_are_hybrid(name):
    shape = SHAPES[name]
    kinds = [shape.is_recurrent(il) for il in range(shape.n_layer)]
    assert kinds.count(True) >= 2 and kinds.count(False) >= 1


def test_qwen35_layers_follow_the_full_attention_interval():
    shape = SHAPES["qwen35-0.8b"]
    assert [il for il in range(shape.n_layer) if not shape.is_recurrent(il)] == [3, 7, 11, 15, 19, 23]


@pytest.mark.parametrize("name, n_layer, n_embd", [
    # llama.cpp's qwen35 type table: 24 layers -> 0.8B at n_embd 1024, else 2B; 32 -> 9B unless 2560
    ("qwen35-0.8b", 24, 1024), ("qwen35-2b", 24, 2048), ("qwen35-9b", 32, 4096),
    ("lfm2-1.2b", 16, 2048),
])
def test_real_shapes_match_llama_cpp_type_table(name, n_layer, n_embd):
    shape = SHAPES[name]
    assert (shape.n_layer, shape.n_embd) == (n_layer, n_embd)
    if shape.arch == "lfm2":
        assert shape.n_ff == 8192  # llama.cpp's LFM2 table: n_ff 8192 is LLM_TYPE_1_2B


@pytest.mark.parametrize("name, low, high", [
    ("qwen35-0.8b", 0.70e9, 0.85e9), ("qwen35-2b", 1.7e9, 2.1e9), ("qwen35-9b", 8.5e9, 9.5e9),
])
def test_real_qwen35_shapes_have_their_parameter_counts(name, low, high):
    shape = SHAPES[name]
    tensors = synthetic._tensors(shape, shape.n_vocab or 0, 151936, mtp=False)
    assert low < sum(t.n_elements for t in tensors) < high


def test_mtp_adds_one_attention_block_with_the_nextn_tensors():
    shape = SHAPES["qwen35-tiny"]
    plain = {t.name for t in synthetic._tensors(shape, 151936, 151936, mtp=False)}
    with_mtp = {t.name for t in synthetic._tensors(shape, 151936, 151936, mtp=True)}
    extra = with_mtp - plain
    n = shape.n_layer
    assert plain <= with_mtp and all(name.startswith(f"blk.{n}.") for name in extra)
    assert {f"blk.{n}.nextn.{part}.weight" for part in
            ("eh_proj", "enorm", "hnorm", "shared_head_norm")} <= extra
    assert f"blk.{n}.attn_q.weight" in extra and f"blk.{n}.ssm_a" not in extra


def test_q8_0_chunks_have_the_promised_size_and_zero_padding_rows():
    t = synthetic._Tensor("m", (64, 10), "normal", 0.1, zero_rows_from=7)
    (chunk,) = synthetic._chunks(t, "Q8_0", seed=0)
    assert chunk.nbytes == synthetic._nbytes(t, "Q8_0") == 10 * 2 * 34
    rows = chunk.reshape(10, -1)
    assert not rows[7:].any() and rows[:7, 2:].any()
    scale = np.frombuffer(rows[0, :2].tobytes(), np.float16)[0]
    assert scale == np.float16(0.1 / 73.9)


def test_lfm2_has_no_mtp():
    with pytest.raises(ValueError, match="no MTP"):
        synthetic.cached("lfm2-tiny", mtp=True)
    with pytest.raises(ValueError, match="unknown shape"):
        synthetic.cached("nope")


def test_cache_names_encode_the_arguments():
    names = {synthetic.cache_name("qwen35-tiny", mtp=m, chat_template=c, seed=s)
             for m in (False, True) for c in (False, True) for s in (0, 1)}
    assert len(names) == 8
    assert all(f"v{synthetic.VERSION}" in n for n in names)


# --------------------------------------------------------------------------- files (real)


@pytest.fixture(scope="module")
def tiny_files():
    pytest.importorskip("gguf")
    return {(name, mtp): synthetic.cached(name, mtp=mtp) for name, mtp in TINY}


def _meta(path):
    with open(path, "rb") as fh:
        return read_metadata(fh)


@pytest.mark.real
def test_files_carry_the_architecture_and_the_tokenizer(tiny_files):
    meta = _meta(tiny_files[("qwen35-tiny", True)])
    assert meta["general.architecture"] == "qwen35"
    assert meta["qwen35.block_count"] == SHAPES["qwen35-tiny"].n_layer + 1
    assert meta["qwen35.nextn_predict_layers"] == 1
    assert meta["qwen35.attention.recurrent_layers"] == [True, True, True, False, False]
    assert meta["tokenizer.ggml.pre"] == "qwen2" and len(meta["tokenizer.ggml.tokens"]) == 151936
    assert "tokenizer.chat_template" in meta
    lfm2 = _meta(tiny_files[("lfm2-tiny", False)])
    assert lfm2["lfm2.attention.head_count_kv"] == [0, 0, 2, 0]


@pytest.mark.real
def test_writing_is_seeded_and_the_template_optional(tmp_path, tiny_files):
    a = synthetic.write_gguf(tmp_path / "a.gguf", "lfm2-tiny", seed=0, chat_template=False)
    b = synthetic.write_gguf(tmp_path / "b.gguf", SHAPES["lfm2-tiny"], seed=1, chat_template=False)
    assert not filecmp.cmp(a, b, shallow=False)
    assert filecmp.cmp(tiny_files[("lfm2-tiny", False)],
                       synthetic.write_gguf(tmp_path / "c.gguf", "lfm2-tiny"), shallow=False)
    assert "tokenizer.chat_template" not in _meta(a)


@pytest.mark.real
def test_padded_vocabulary_and_command_line(tmp_path, capsys):
    pytest.importorskip("gguf")
    small = dataclasses.replace(SHAPES["qwen35-tiny"], name="padded", n_vocab=152000)
    path = synthetic.write_gguf(tmp_path / "p.gguf", small)
    meta = _meta(path)
    assert meta["tokenizer.ggml.tokens"][-1] == "[PAD151999]"
    types = meta["tokenizer.ggml.token_type"]
    assert types[-1] == 5 and len(types) == 152000  # LLAMA_TOKEN_TYPE_UNUSED
    out = tmp_path / "cli.gguf"
    assert synthetic.main(["lfm2-tiny", "--no-chat-template", "--seed", "3", "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert _meta(out)["general.name"].endswith("seed 3")


# --------------------------------------------------------------------------- llama.cpp (real)


#: the loaded models by pointer, freed by _free (edgespec's LlamaModel picks the devices)
_LOADED: dict = {}


def _load(path, *, load_mtp=False):
    """The ``llama_model *`` of ``path``, loaded as edgespec loads a model: on this machine,
    never on an RPC worker an earlier test registered and stopped (llama.cpp's default would
    offload every layer to it)."""
    from pathlib import Path

    from edgespec.runtime.llama_model import LlamaModel

    loaded = LlamaModel(Path(path), load_mtp=load_mtp)
    pointer = loaded.handle.model
    assert pointer, f"llama.cpp could not load {path}"
    _LOADED[pointer] = loaded
    return pointer


def _free(pointer) -> None:
    _LOADED.pop(pointer).close()


def _context(model, **fields):
    import llama_cpp

    params = llama_cpp.llama_context_default_params()
    params.n_ctx = params.n_batch = params.n_ubatch = 256
    params.n_threads = params.n_threads_batch = 1  # tiny: threads would only wait on each other
    for key, value in fields.items():
        setattr(params, key, value)
    return llama_cpp.llama_init_from_model(model, params)


def _greedy(path, n=16, **load):
    """A fresh load's greedy continuation of PROMPT."""
    import llama_cpp

    model = _load(path, **load)
    ctx = _context(model)
    try:
        vocab = llama_cpp.llama_model_get_vocab(model)
        n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        buf = (llama_cpp.llama_token * 64)()
        n_prompt = llama_cpp.llama_tokenize(vocab, PROMPT, len(PROMPT), buf, 64, False, True)
        assert n_prompt > 0
        batch = llama_cpp.llama_batch_get_one(buf, n_prompt)
        out: list[int] = []
        one = (llama_cpp.llama_token * 1)()
        for _ in range(n):
            assert llama_cpp.llama_decode(ctx, batch) == 0
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
            assert np.isfinite(logits).all()
            one[0] = int(np.argmax(logits))
            out.append(one[0])
            batch = llama_cpp.llama_batch_get_one(one, 1)
        return out, bool(llama_cpp.llama_model_is_hybrid(model))
    finally:
        llama_cpp.llama_free(ctx)
        _free(model)


@pytest.mark.real
@pytest.mark.parametrize("name, mtp", TINY, ids=[f"{n}{'-mtp' if m else ''}" for n, m in TINY])
def test_tiny_models_decode_greedily_deterministically_and_varied(tiny_files, name, mtp):
    first, hybrid = _greedy(tiny_files[(name, mtp)])
    second, _ = _greedy(tiny_files[(name, mtp)])
    assert hybrid
    assert first == second
    assert len(set(first)) >= 3, first


@pytest.mark.real
def test_mtp_loads_and_makes_an_mtp_context(tiny_files):
    import llama_cpp

    model = _load(tiny_files[("qwen35-tiny", True)], load_mtp=True)
    try:
        assert llama_cpp.llama_model_n_layer_nextn(model) == 1
        assert llama_cpp.llama_model_n_layer(model) == SHAPES["qwen35-tiny"].n_layer  # the trunk
        mtp_ctx = _context(model, ctx_type=llama_cpp.LLAMA_CONTEXT_TYPE_MTP)
        assert mtp_ctx
        llama_cpp.llama_free(mtp_ctx)
        # the trunk context keeps recurrent snapshots for partial rollback (qwen35 supports it)
        ctx = _context(model, n_rs_seq=4)
        assert llama_cpp.llama_n_rs_seq(ctx) == 4
        llama_cpp.llama_free(ctx)
    finally:
        _free(model)


@pytest.mark.real
def test_a_model_without_mtp_layers_refuses_an_mtp_context(tiny_files):
    import llama_cpp

    model = _load(tiny_files[("lfm2-tiny", False)])
    try:
        assert llama_cpp.llama_model_n_layer_nextn(model) == 0
        assert not _context(model, ctx_type=llama_cpp.LLAMA_CONTEXT_TYPE_MTP)
        ctx = _context(model, n_rs_seq=2)
        assert llama_cpp.llama_n_rs_seq(ctx) == 2  # LFM2 supports partial rollback too
        llama_cpp.llama_free(ctx)
    finally:
        _free(model)


@pytest.mark.real
def test_mtp_context_without_load_mtp_aborts_the_process(tiny_files):
    # llama.cpp 0.3.36 reports the MTP layer (n_layer_nextn 1) but, not having loaded its
    # tensors, asserts in the MTP graph: whoever makes an MTP context must load with load_mtp
    script = textwrap.dedent(f"""
        import llama_cpp
        params = llama_cpp.llama_model_default_params()
        path = {str(tiny_files[("qwen35-tiny", True)])!r}
        model = llama_cpp.llama_model_load_from_file(path.encode(), params)
        assert llama_cpp.llama_model_n_layer_nextn(model) == 1
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = 256
        cp.ctx_type = llama_cpp.LLAMA_CONTEXT_TYPE_MTP
        llama_cpp.llama_init_from_model(model, cp)
        print("survived")
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "survived" not in run.stdout
    assert "nextn.eh_proj" in run.stderr
