"""GGUF files with random weights of real hybrid architectures: Qwen3.5 and LFM2.

Why: what edgespec guarantees (the output is exactly what the target alone would give) and what
a round costs (how long llama.cpp takes to score, draft, roll back) depend on the architecture and
its shapes, not on the values of the weights: a model of the real shapes filled with random
numbers runs the same kernels on the same tensor sizes as the trained one. Only acceptance (how
often a draft is right) depends on what the weights learned, so numbers about acceptance measured
on these files mean nothing; numbers about exactness and cost do. They let the 2026 hybrid
architectures (recurrent layers whose state cannot simply be truncated, MTP heads) be tested and
timed without downloading gigabytes of trained weights.

What is written (reference: the llama.cpp vendored by llama-cpp-python 0.3.36, its
``src/models/qwen35.cpp``, ``lfm2.cpp`` and ``src/llama-arch.cpp``):

* ``qwen35`` (Qwen3.5 dense): Gated DeltaNet linear-attention layers with a full (gated,
  QK-normed, partial interleaved M-RoPE) attention layer every 4th layer; optionally (``mtp``)
  one MTP block after the trunk (``qwen35.nextn_predict_layers = 1``, ``block_count`` counting
  it, tensors ``blk.{n_layer}.*`` with ``blk.{n_layer}.nextn.{eh_proj,enorm,hnorm,
  shared_head_norm}``), which llama.cpp loads with ``llama_model_params.load_mtp`` and runs in a
  ``LLAMA_CONTEXT_TYPE_MTP`` context.
* ``lfm2`` (LFM2): short-convolution layers and GQA attention layers (per-layer
  ``head_count_kv``, 0 for a convolution layer).

The tokenizer is a real one: every ``tokenizer.ggml.*`` key (and, with ``chat_template``, the
``tokenizer.chat_template``) of Qwen2.5-Coder-0.5B-Instruct's GGUF (gpt2 BPE, qwen2
pre-tokenizer, 151936 tokens), fetched through the catalog if it is not cached. It is read with
edgespec's own header reader (:mod:`edgespec.models.gguf_meta`, 0.1 s) rather than gguf-py's
``GGUFReader`` (9 s on that file). Qwen3.5's own vocabulary has 248320 entries: the real-shape
Qwen3.5 presets pad the tokenizer to that size with unused ``[PAD…]`` tokens (as Qwen2.5 pads its
own 151665 to 151936) so that the embedding and the output matrix have the real sizes; their rows
are zero, so a pad is never the greedy choice. LFM2's real vocabulary (65536) is smaller than this
tokenizer's: ``lfm2-1.2b``'s embedding and output are 151936 rows, 2.3 times the real ones.

Weights: seeded (``seed``; every tensor from its own generator keyed by seed and name, so a file
is the same whatever order it is written in). Matrices have standard deviation 1/sqrt(fan-in),
so every layer's output is of order 1 whatever the width; the embedding (and the output matrix
where it is not tied) 2/sqrt(n_embd), so logits have a standard deviation of about 2; norms are 1;
DeltaNet's ``ssm_a`` (= -exp(A_log)) is -U(1, 16) and ``ssm_dt.bias`` softplus^-1 of
exp(U(log 1e-3, log 1e-1)), the ranges of the reference initialisation, so states decay at
varied rates. Greedy continuations are deterministic and varied (not one token repeated).

Types: the tiny presets are all F32 (standard normal values). The real-shape presets store every
matrix whose rows are a multiple of 32 in Q8_0, with quants drawn uniformly from all int8 values
and one scale per tensor (far faster to make than rounding normal floats; a Q8_0 kernel costs the
same whatever the quants), and the vectors and convolution kernels in F32, as llama.cpp's
converters do.

Files are written streaming (header first, then one tensor at a time in chunks), so writing the
9B preset needs little memory. :func:`cached` writes a file once into
``<cache>/models/synthetic/`` (``<cache>`` as :func:`edgespec.config.cache_dir`), atomically.

Needs ``gguf`` (gguf-py, the writer; pinned in the ``test`` extra), imported only when a file is
written: the rest of edgespec does not need it.

Command line: ``python -m edgespec.models.synthetic SHAPE [--mtp] [--no-chat-template]
[--seed N] [-o PATH]`` writes the file (into the cache unless ``-o``) and prints its path.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

#: bumped whenever the bytes written for the same arguments change: part of cached file names
VERSION = 1

#: the GGUF whose tokenizer the synthetic models carry (a catalog name)
TOKENIZER_SOURCE = "qwen2.5-coder-0.5b-instruct-q4_k_m"

#: rows of a matrix made and written at a time (bounds the writer's memory)
_CHUNK_ELEMENTS = 1 << 24
#: standard deviation of the logits (embedding / output scale times sqrt(n_embd))
_LOGIT_STD = 2.0
_QK8_0 = 32  # elements per Q8_0 block: a float16 scale and 32 int8 quants
_Q8_0_BLOCK_BYTES = 2 + _QK8_0
#: general.file_type: LLAMA_FTYPE_ALL_F32 and LLAMA_FTYPE_MOSTLY_Q8_0
_FILE_TYPE = {"F32": 0, "Q8_0": 7}


@dataclass(frozen=True)
class Shape:
    """The hyper-parameters of one synthetic model.

    ``n_layer`` counts the trunk's layers (an MTP block, when written, comes after them).
    ``n_vocab`` None keeps the tokenizer's size; a larger one pads it with unused tokens.
    qwen35: ``head_dim`` is the attention's key/value length, the DeltaNet layers have
    ``ssm_n_group`` key heads and ``ssm_dt_rank`` value heads of ``ssm_d_state`` each, and layer
    ``i`` is full attention when ``(i + 1) % full_attention_interval == 0``. lfm2: the layers in
    ``attn_layers`` are attention (head size ``n_embd // n_head``), the others short
    convolutions of ``conv_l_cache`` taps.
    """

    name: str
    arch: str  # "qwen35" or "lfm2"
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    tied: bool  # output matrix = token embedding (no output.weight written)
    n_ctx_train: int
    rope_freq_base: float
    rms_eps: float
    quant: str = "F32"  # "F32" (everything) or "Q8_0" (matrices; vectors stay F32)
    n_vocab: int | None = None
    # qwen35
    head_dim: int = 0
    n_rot: int = 0
    rope_sections: tuple[int, ...] = ()
    ssm_d_conv: int = 4
    ssm_d_state: int = 0
    ssm_n_group: int = 0
    ssm_dt_rank: int = 0
    full_attention_interval: int = 4
    # lfm2
    attn_layers: tuple[int, ...] = field(default=())
    conv_l_cache: int = 3

    def is_recurrent(self, il: int) -> bool:
        """Whether trunk layer ``il`` is recurrent (DeltaNet or short convolution)."""
        if self.arch == "qwen35":
            return (il + 1) % self.full_attention_interval != 0
        return il not in self.attn_layers

    @property
    def supports_mtp(self) -> bool:
        return self.arch == "qwen35"


def _qwen35(name: str, **kw: Any) -> Shape:
    base: dict[str, Any] = dict(
        arch="qwen35", head_dim=256, n_rot=64, rope_sections=(11, 11, 10, 0), ssm_d_conv=4,
        ssm_d_state=128, full_attention_interval=4, n_ctx_train=262144, rope_freq_base=1e7,
        rms_eps=1e-6,
    )
    return Shape(name=name, **{**base, **kw})


def _lfm2(name: str, **kw: Any) -> Shape:
    base: dict[str, Any] = dict(arch="lfm2", conv_l_cache=3, n_ctx_train=128000,
                                rope_freq_base=1e6, rms_eps=1e-5)
    return Shape(name=name, **{**base, **kw})


#: Qwen3.5's tokenizer size (the real-shape Qwen3.5 presets pad to it)
QWEN35_VOCAB = 248320

# Sources of the real shapes:
# * Qwen3.5 (Feb. 2026): every dense size has head_dim 256, partial rotary 0.25 (n_rot 64),
#   interleaved M-RoPE sections [11, 11, 10] (llama.cpp's converter default), rope theta 1e7,
#   rms eps 1e-6, DeltaNet key/value head dim 128, conv kernel 4, full attention every 4th
#   layer, one MTP layer. llama.cpp's LLM_TYPE mapping for qwen35 (24 layers: 0.8B if n_embd is
#   1024 else 2B; 32 layers: 4B if n_embd is 2560 else 9B) fixes layers and widths.
#   Heads and FFN: 0.8B 8/2 heads, FFN 3584 (the model card as quoted by apxml.com and
#   fitmygpu.com; 16 key and 16 value DeltaNet heads, from a config derived from 0.8B), 2B 8/2
#   heads (fitmygpu.com), 16/16 DeltaNet heads and FFN 6144 (best knowledge of the released
#   config, not confirmed here); 9B 16/4 heads, FFN 12288, 16 key and 32 value DeltaNet heads
#   (configs of Qwen3.5-9B fine-tunes on huggingface.co; the same DeltaNet heads as the 4B's
#   GGUF header). 0.8B and 2B tie the output to the embedding, 9B does not.
# * LFM2-1.2B: hidden 2048, 16 layers with attention at 2, 5, 8, 10, 12, 14, 32 heads / 8 KV,
#   FFN 8192 (block_ff_dim 12288 auto-adjusted by 2/3 to a multiple of 256, as llama.cpp's
#   converter does; llama.cpp's LFM2 type table maps n_ff 8192 to 1.2B), conv L_cache 3,
#   rope theta 1e6, norm eps 1e-5, tied (LiquidAI/LFM2-1.2B's config.json).
SHAPES: dict[str, Shape] = {
    s.name: s
    for s in (
        # tiny: 3 DeltaNet layers then 1 attention layer; 1 key head for 2 value heads as in
        # the 4B and 9B (the broadcast path); the real head sizes (the kernels' real paths)
        _qwen35("qwen35-tiny", n_embd=64, n_layer=4, n_ff=128, n_head=2, n_head_kv=1,
                ssm_n_group=1, ssm_dt_rank=2, tied=True, n_ctx_train=8192),
        _lfm2("lfm2-tiny", n_embd=64, n_layer=4, n_ff=128, n_head=4, n_head_kv=2,
              attn_layers=(2,), tied=True, n_ctx_train=8192),
        _qwen35("qwen35-0.8b", n_embd=1024, n_layer=24, n_ff=3584, n_head=8, n_head_kv=2,
                ssm_n_group=16, ssm_dt_rank=16, tied=True, n_vocab=QWEN35_VOCAB, quant="Q8_0"),
        _qwen35("qwen35-2b", n_embd=2048, n_layer=24, n_ff=6144, n_head=8, n_head_kv=2,
                ssm_n_group=16, ssm_dt_rank=16, tied=True, n_vocab=QWEN35_VOCAB, quant="Q8_0"),
        _qwen35("qwen35-9b", n_embd=4096, n_layer=32, n_ff=12288, n_head=16, n_head_kv=4,
                ssm_n_group=16, ssm_dt_rank=32, tied=False, n_vocab=QWEN35_VOCAB, quant="Q8_0"),
        _lfm2("lfm2-1.2b", n_embd=2048, n_layer=16, n_ff=8192, n_head=32, n_head_kv=8,
              attn_layers=(2, 5, 8, 10, 12, 14), tied=True, quant="Q8_0"),
    )
}


# --------------------------------------------------------------------------- the tokenizer


@lru_cache(maxsize=4)
def _tokenizer_kv(source: str) -> tuple[tuple[str, Any], ...]:
    """The ``tokenizer.*`` keys of the GGUF ``source`` (a path or catalog name), in file order."""
    from .gguf_meta import read_metadata
    from .resolve import resolve_model

    path = resolve_model(source, progress=False)
    with open(path, "rb") as fh:
        meta = read_metadata(fh)
    return tuple((k, v) for k, v in meta.items() if k.startswith("tokenizer."))


def _add_tokenizer(writer: Any, kv: Sequence[tuple[str, Any]], *, n_vocab: int | None,
                   chat_template: bool) -> int:
    """Add the tokenizer's keys to ``writer`` (padded to ``n_vocab``); returns the vocab size."""
    from gguf import GGUFValueType as T

    size = 0
    for key, value in kv:
        if key == "tokenizer.chat_template" and not chat_template:
            continue
        if key == "tokenizer.ggml.tokens":
            size = len(value)
            if n_vocab is not None and n_vocab > size:
                value = list(value) + [f"[PAD{i}]" for i in range(size, n_vocab)]
        elif key == "tokenizer.ggml.token_type" and n_vocab is not None and n_vocab > len(value):
            value = list(value) + [5] * (n_vocab - len(value))  # LLAMA_TOKEN_TYPE_UNUSED
        elif key == "tokenizer.ggml.scores" and n_vocab is not None and n_vocab > len(value):
            value = list(value) + [0.0] * (n_vocab - len(value))
        if isinstance(value, list):
            first = value[0]
            sub = (T.STRING if isinstance(first, str) else T.BOOL if isinstance(first, bool)
                   else T.INT32 if isinstance(first, int) else T.FLOAT32)
            writer.add_key_value(key, value, T.ARRAY, sub_type=sub)
        elif isinstance(value, str):
            writer.add_key_value(key, value, T.STRING)
        elif isinstance(value, bool):
            writer.add_key_value(key, value, T.BOOL)
        elif isinstance(value, int):
            writer.add_key_value(key, value, T.UINT32)  # token ids (the spec's type)
        else:
            writer.add_key_value(key, float(value), T.FLOAT32)
    if size == 0:
        raise ValueError(f"{TOKENIZER_SOURCE}: no tokenizer.ggml.tokens")
    return max(size, n_vocab or 0)


# --------------------------------------------------------------------------- tensors


@dataclass(frozen=True)
class _Tensor:
    """One tensor to write: ``ne`` in ggml's order (ne[0] the contiguous length)."""

    name: str
    ne: tuple[int, ...]
    init: str  # "normal" (std), "ones", "ssm_a", "dt_bias"
    std: float = 0.0
    zero_rows_from: int | None = None  # rows from here on are zero (vocabulary padding)
    quantize: bool = True  # may be Q8_0 (when 2-D and the shape's quant says so)

    @property
    def n_elements(self) -> int:
        return math.prod(self.ne)


def _matrix(name: str, n_in: int, n_out: int) -> _Tensor:
    return _Tensor(name, (n_in, n_out), "normal", 1.0 / math.sqrt(n_in))


def _vector(name: str, n: int, init: str = "ones") -> _Tensor:
    return _Tensor(name, (n,), init)


def _attention(shape: Shape, il: int, n_q: int, n_kv: int, head_dim: int) -> list[_Tensor]:
    p, e = f"blk.{il}", shape.n_embd
    return [
        _matrix(f"{p}.attn_q.weight", e, n_q),
        _matrix(f"{p}.attn_k.weight", e, n_kv),
        _matrix(f"{p}.attn_v.weight", e, n_kv),
        _vector(f"{p}.attn_q_norm.weight", head_dim),
        _vector(f"{p}.attn_k_norm.weight", head_dim),
    ]


def _ffn(shape: Shape, il: int) -> list[_Tensor]:
    p, e, f = f"blk.{il}", shape.n_embd, shape.n_ff
    return [
        _matrix(f"{p}.ffn_gate.weight", e, f),
        _matrix(f"{p}.ffn_up.weight", e, f),
        _matrix(f"{p}.ffn_down.weight", f, e),
    ]


def _qwen35_attention_block(shape: Shape, il: int) -> list[_Tensor]:
    p, e, hd = f"blk.{il}", shape.n_embd, shape.head_dim
    return [
        _vector(f"{p}.attn_norm.weight", e),
        _vector(f"{p}.post_attention_norm.weight", e),
        # the query projection also makes the output gate: 2 * head_dim per head
        *_attention(shape, il, 2 * hd * shape.n_head, hd * shape.n_head_kv, hd),
        _matrix(f"{p}.attn_output.weight", hd * shape.n_head, e),
        *_ffn(shape, il),
    ]


def _qwen35_tensors(shape: Shape, mtp: bool) -> list[_Tensor]:
    e = shape.n_embd
    key_dim = shape.ssm_d_state * shape.ssm_n_group
    value_dim = shape.ssm_d_state * shape.ssm_dt_rank
    conv_dim = 2 * key_dim + value_dim
    out: list[_Tensor] = []
    for il in range(shape.n_layer):
        if not shape.is_recurrent(il):
            out += _qwen35_attention_block(shape, il)
            continue
        p = f"blk.{il}"
        out += [
            _vector(f"{p}.attn_norm.weight", e),
            _vector(f"{p}.post_attention_norm.weight", e),
            _matrix(f"{p}.attn_qkv.weight", e, conv_dim),
            _matrix(f"{p}.attn_gate.weight", e, value_dim),
            _Tensor(f"{p}.ssm_conv1d.weight", (shape.ssm_d_conv, conv_dim), "normal",
                    1.0 / math.sqrt(shape.ssm_d_conv), quantize=False),
            _vector(f"{p}.ssm_dt.bias", shape.ssm_dt_rank, "dt_bias"),
            _vector(f"{p}.ssm_a", shape.ssm_dt_rank, "ssm_a"),
            _matrix(f"{p}.ssm_beta.weight", e, shape.ssm_dt_rank),
            _matrix(f"{p}.ssm_alpha.weight", e, shape.ssm_dt_rank),
            _vector(f"{p}.ssm_norm.weight", shape.ssm_d_state),
            _matrix(f"{p}.ssm_out.weight", value_dim, e),
            *_ffn(shape, il),
        ]
    if mtp:
        il = shape.n_layer
        p = f"blk.{il}"
        out += _qwen35_attention_block(shape, il)
        out += [
            _matrix(f"{p}.nextn.eh_proj.weight", 2 * e, e),
            _vector(f"{p}.nextn.enorm.weight", e),
            _vector(f"{p}.nextn.hnorm.weight", e),
            _vector(f"{p}.nextn.shared_head_norm.weight", e),
        ]
    return out


def _lfm2_tensors(shape: Shape) -> list[_Tensor]:
    e = shape.n_embd
    head_dim = e // shape.n_head
    out: list[_Tensor] = []
    for il in range(shape.n_layer):
        p = f"blk.{il}"
        out += [_vector(f"{p}.attn_norm.weight", e), _vector(f"{p}.ffn_norm.weight", e)]
        if shape.is_recurrent(il):
            out += [
                _Tensor(f"{p}.shortconv.conv.weight", (shape.conv_l_cache, e), "normal",
                        1.0 / math.sqrt(shape.conv_l_cache), quantize=False),
                _matrix(f"{p}.shortconv.in_proj.weight", e, 3 * e),
                _matrix(f"{p}.shortconv.out_proj.weight", e, e),
            ]
        else:
            out += _attention(shape, il, e, head_dim * shape.n_head_kv, head_dim)
            out.append(_matrix(f"{p}.attn_output.weight", e, e))
        out += _ffn(shape, il)
    return out


def _tensors(shape: Shape, n_vocab: int, n_real: int, mtp: bool) -> list[_Tensor]:
    e = shape.n_embd
    std = _LOGIT_STD / math.sqrt(e)
    pad = n_real if n_vocab > n_real else None
    out = [_Tensor("token_embd.weight", (e, n_vocab), "normal", std, zero_rows_from=pad)]
    # LFM2's final norm keeps an old name (llama-arch.cpp: LLM_TENSOR_OUTPUT_NORM_LFM2)
    out.append(_vector("token_embd_norm.weight" if shape.arch == "lfm2" else "output_norm.weight", e))
    if not shape.tied:
        out.append(_Tensor("output.weight", (e, n_vocab), "normal", std, zero_rows_from=pad))
    out += _qwen35_tensors(shape, mtp) if shape.arch == "qwen35" else _lfm2_tensors(shape)
    return out


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def _ggml_type(shape: Shape, t: _Tensor) -> str:
    if shape.quant == "Q8_0" and t.quantize and len(t.ne) == 2 and t.ne[0] % _QK8_0 == 0:
        return "Q8_0"
    return "F32"


def _nbytes(t: _Tensor, qtype: str) -> int:
    if qtype == "Q8_0":
        return t.n_elements // _QK8_0 * _Q8_0_BLOCK_BYTES
    return t.n_elements * 4


def _chunks(t: _Tensor, qtype: str, seed: int) -> Iterator[np.ndarray]:
    """The bytes of ``t`` as ``qtype``, a few rows at a time."""
    rng = _rng(seed, t.name)
    if t.init != "normal":
        n = t.n_elements
        if t.init == "ones":
            data = np.ones(n, np.float32)
        elif t.init == "ssm_a":  # -exp(A_log) with A ~ U(1, 16)
            data = -rng.uniform(1.0, 16.0, n).astype(np.float32)
        elif t.init == "dt_bias":  # softplus^-1(dt), dt log-uniform in [1e-3, 1e-1]
            dt = np.exp(rng.uniform(math.log(1e-3), math.log(1e-1), n))
            data = (dt + np.log(-np.expm1(-dt))).astype(np.float32)
        else:
            raise ValueError(t.init)
        yield data
        return
    row = t.ne[0]
    rows = t.n_elements // row
    step = max(1, _CHUNK_ELEMENTS // row)
    if qtype == "Q8_0":
        # uniform int8 quants have standard deviation ~73.9: one scale gives the wanted std
        scale = np.frombuffer(np.float16(t.std / 73.9).tobytes(), np.uint8)
        blocks_per_row = row // _QK8_0
    for r0 in range(0, rows, step):
        n_rows = min(step, rows - r0)
        live = n_rows if t.zero_rows_from is None else max(0, min(n_rows, t.zero_rows_from - r0))
        if qtype == "Q8_0":
            out = np.zeros((n_rows * blocks_per_row, _Q8_0_BLOCK_BYTES), np.uint8)
            nb = live * blocks_per_row
            out[:nb, :2] = scale
            out[:nb, 2:] = np.frombuffer(rng.bytes(nb * _QK8_0), np.uint8).reshape(nb, _QK8_0)
        else:
            out = np.zeros((n_rows, row), np.float32)
            out[:live] = rng.standard_normal((live, row), dtype=np.float32) * np.float32(t.std)
        yield out


# --------------------------------------------------------------------------- the file


def _shape_of(shape: str | Shape) -> Shape:
    if isinstance(shape, Shape):
        return shape
    try:
        return SHAPES[shape]
    except KeyError:
        raise ValueError(f"unknown shape {shape!r}: one of {', '.join(SHAPES)}") from None


def _add_hparams(w: Any, shape: Shape, mtp: bool) -> None:
    from gguf import GGUFValueType as T

    a = shape.arch
    n_blocks = shape.n_layer + (1 if mtp else 0)
    w.add_uint32(f"{a}.context_length", shape.n_ctx_train)
    w.add_uint32(f"{a}.embedding_length", shape.n_embd)
    w.add_uint32(f"{a}.block_count", n_blocks)
    w.add_uint32(f"{a}.feed_forward_length", shape.n_ff)
    w.add_uint32(f"{a}.attention.head_count", shape.n_head)
    w.add_float32(f"{a}.rope.freq_base", shape.rope_freq_base)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", shape.rms_eps)
    if a == "qwen35":
        w.add_uint32(f"{a}.attention.head_count_kv", shape.n_head_kv)
        w.add_uint32(f"{a}.attention.key_length", shape.head_dim)
        w.add_uint32(f"{a}.attention.value_length", shape.head_dim)
        w.add_uint32(f"{a}.rope.dimension_count", shape.n_rot)
        w.add_key_value(f"{a}.rope.dimension_sections", list(shape.rope_sections), T.ARRAY,
                        sub_type=T.INT32)
        w.add_uint32(f"{a}.ssm.conv_kernel", shape.ssm_d_conv)
        w.add_uint32(f"{a}.ssm.state_size", shape.ssm_d_state)
        w.add_uint32(f"{a}.ssm.group_count", shape.ssm_n_group)
        w.add_uint32(f"{a}.ssm.time_step_rank", shape.ssm_dt_rank)
        w.add_uint32(f"{a}.ssm.inner_size", shape.ssm_d_state * shape.ssm_dt_rank)
        # as the converter writes them: the layer types (the MTP block is not recurrent) and
        # the interval they follow
        recurrent = [shape.is_recurrent(il) for il in range(shape.n_layer)]
        recurrent += [False] * (n_blocks - shape.n_layer)
        w.add_key_value(f"{a}.attention.recurrent_layers", recurrent, T.ARRAY, sub_type=T.BOOL)
        w.add_uint32(f"{a}.full_attention_interval", shape.full_attention_interval)
        if mtp:
            w.add_uint32(f"{a}.nextn_predict_layers", 1)
    else:
        # LFM2: a convolution layer is one without KV heads
        kv = [0 if shape.is_recurrent(il) else shape.n_head_kv for il in range(shape.n_layer)]
        w.add_key_value(f"{a}.attention.head_count_kv", kv, T.ARRAY, sub_type=T.INT32)
        w.add_uint32(f"{a}.shortconv.l_cache", shape.conv_l_cache)


def write_gguf(path: Path, shape: str | Shape, *, mtp: bool = False, chat_template: bool = True,
               seed: int = 0) -> Path:
    """Write a GGUF of ``shape`` (a :data:`SHAPES` name or a :class:`Shape`) with random weights
    to ``path`` (overwritten, not atomically: :func:`cached` is) and return ``path``.

    ``mtp`` adds Qwen3.5's MTP block (ValueError for LFM2); ``chat_template`` False leaves
    ``tokenizer.chat_template`` out; ``seed`` seeds the weights. Needs ``gguf``.
    """
    import gguf

    spec = _shape_of(shape)
    if mtp and not spec.supports_mtp:
        raise ValueError(f"{spec.name}: {spec.arch} has no MTP layers")
    path = Path(path)
    kv = _tokenizer_kv(TOKENIZER_SOURCE)
    n_real = len(dict(kv)["tokenizer.ggml.tokens"])

    w = gguf.GGUFWriter(path, spec.arch)
    try:
        w.add_string("general.type", "model")
        w.add_string("general.name",
                     f"edgespec synthetic {spec.name}{' mtp' if mtp else ''} seed {seed}")
        w.add_string("general.description",
                     f"random weights (edgespec.models.synthetic v{VERSION}): exactness and costs "
                     "are the real architecture's, acceptance means nothing")
        w.add_uint32("general.file_type", _FILE_TYPE[spec.quant])
        w.add_uint32("general.quantization_version", gguf.GGML_QUANT_VERSION)
        _add_hparams(w, spec, mtp)
        n_vocab = _add_tokenizer(w, kv, n_vocab=spec.n_vocab, chat_template=chat_template)
        if spec.arch == "lfm2":
            w.add_uint32("lfm2.vocab_size", n_vocab)

        tensors = _tensors(spec, n_vocab, n_real, mtp)
        types = [_ggml_type(spec, t) for t in tensors]
        for t, q in zip(tensors, types):
            w.add_tensor_info(t.name, tuple(reversed(t.ne)), np.dtype(np.float32), _nbytes(t, q),
                              raw_dtype=gguf.GGMLQuantizationType[q])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        assert w.fout is not None
        fout = w.fout[0]
        for t, q in zip(tensors, types):
            w.write_padding(fout, fout.tell())  # each tensor starts aligned
            written = 0
            for chunk in _chunks(t, q, seed):
                chunk.tofile(fout)
                written += chunk.nbytes
            if written != _nbytes(t, q):
                raise AssertionError(f"{t.name}: wrote {written} bytes, expected {_nbytes(t, q)}")
            w.write_padding(fout, written)
        fout.flush()
    finally:
        w.close()
    return path


def cache_name(shape: str, *, mtp: bool = False, chat_template: bool = True, seed: int = 0) -> str:
    """The file name :func:`cached` uses for these arguments."""
    parts = [shape, "mtp" if mtp else None, None if chat_template else "notmpl", f"s{seed}",
             f"v{VERSION}"]
    return "synthetic-" + "-".join(p for p in parts if p) + ".gguf"


def cache_directory() -> Path:
    """``<cache>/models/synthetic``."""
    from ..config import cache_dir

    return cache_dir() / "models" / "synthetic"


def cached(shape: str, *, mtp: bool = False, chat_template: bool = True, seed: int = 0) -> Path:
    """The path of the synthetic GGUF for these arguments, written first if it is not there.

    Written once into :func:`cache_directory` under :func:`cache_name` (which encodes the
    arguments and :data:`VERSION`), through a temporary file renamed into place, so a reader
    never sees half a file and concurrent writers do not clash.
    """
    spec = _shape_of(shape)
    if mtp and not spec.supports_mtp:
        raise ValueError(f"{spec.name}: {spec.arch} has no MTP layers")
    final = cache_directory() / cache_name(shape, mtp=mtp, chat_template=chat_template, seed=seed)
    if final.is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    try:
        write_gguf(tmp, spec, mtp=mtp, chat_template=chat_template, seed=seed)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return final


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m edgespec.models.synthetic",
        description="Write a GGUF with random weights of a real hybrid architecture; print its path.")
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("--mtp", action="store_true", help="add the MTP block (qwen35 only)")
    parser.add_argument("--no-chat-template", action="store_true", help="leave the chat template out")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-o", "--output", type=Path, help="write here (default: the cache)")
    args = parser.parse_args(argv)
    kw = dict(mtp=args.mtp, chat_template=not args.no_chat_template, seed=args.seed)
    try:
        path = write_gguf(args.output, args.shape, **kw) if args.output else cached(args.shape, **kw)
    except ValueError as err:
        parser.error(str(err))
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
