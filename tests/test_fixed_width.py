"""The fixed-width mode on real llama.cpp (CPU): every logit-reading call exactly W tokens wide.

On a GPU this is what makes speculation exact (CUDA picks kernels by batch width); the mechanism
is the same on the CPU, so it is tested here: the pads never change the real rows' logits, they
never stay in the KV cache, they fit at the end of a full context, and greedy speculation equals
plain decoding at one width.
"""

from __future__ import annotations

import llama_cpp
import numpy as np
import pytest

from edgespec.errors import ConfigError, ContextOverflowError
from edgespec.models.resolve import resolve_model
from edgespec.runtime.backend import LlamaBackend, ModelOptions
from edgespec.runtime.engine import Engine
from edgespec.runtime.kernels import BATCH_DEPENDENT, EXACT_FIXED_WIDTH, EXACT_PIECES

from .real_util import GREEDY, batch_noise, ids

pytestmark = pytest.mark.real

CODE = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n        return n\n'
MORE = " return fibonacci(n - 1) + fibonacci(n - 2)\n\nprint(fibonacci(10))"


def _backend(name: str, **kw) -> LlamaBackend:
    return LlamaBackend(ModelOptions(path=resolve_model(name, progress=False), n_threads=2, **kw))


def _text(be: LlamaBackend, n: int, prompt_len: int = 0) -> tuple[list[int], list[int]]:
    prompt = be.tokenize(CODE * 30)[:prompt_len] if prompt_len else be.tokenize(CODE * 2)
    cont = (be.tokenize(MORE, add_special=False) * 4)[:n]
    return prompt, cont


def _cache_end(be: LlamaBackend) -> int:
    """The last position llama.cpp's KV cache holds for the sequence (-1 when empty)."""
    return int(llama_cpp.llama_memory_seq_pos_max(be._ctx.memory, 0))


def _scored_in_calls_of_k(be: LlamaBackend, prompt, cont, k: int) -> np.ndarray:
    """cont's logits, scored k tokens per call after prompt; checks the cache after each call."""
    be.sync(prompt)
    rows = []
    for i in range(0, len(cont), k):
        rows.append(be.decode(cont[i:i + k], len(cont[i:i + k])).copy())
        assert be.tokens == prompt + cont[:i + k]
        assert _cache_end(be) == len(be.tokens) - 1  # the pads are gone
    return np.concatenate(rows)


@pytest.mark.parametrize("model, width, prompt_len", [
    ("smollm2-135m-instruct-q4_1", 4, 0),
    ("smollm2-135m-instruct-q4_1", 16, 0),
    # scored across 512 cells: where the CPU's flash attention (on at a fixed width) would
    # split the KV for a single query, and where llama.cpp's padded KV view grows
    ("qwen2.5-coder-1.5b-instruct-q4_k_m", 8, 505),
])
def test_at_a_fixed_width_the_pads_never_change_the_real_rows(model, width, prompt_len):
    be = _backend(model, n_ctx=1024, fixed_width=width)
    try:
        assert be.kernels == EXACT_FIXED_WIDTH
        # k up to 2W + 1: calls of W, W and 1 tokens
        prompt, cont = _text(be, 2 * width + 1, prompt_len)
        be.decode(prompt, 1)
        single = _scored_in_calls_of_k(be, prompt, cont, 1)
        # calls of one part-filled width, of the full width, one more (W + 1), and W, W, 1
        for k in sorted({2, 3, width - 1, width, width + 1, 2 * width + 1}):
            assert np.array_equal(_scored_in_calls_of_k(be, prompt, cont, k), single), k
        # greedy picks from llama.cpp's backend sampler read the same (real) rows
        be.sync(prompt)
        assert be.decode_argmax(cont, len(cont)) == single.argmax(axis=1).tolist()
        assert _cache_end(be) == len(prompt) + len(cont) - 1
    finally:
        be.close()


def test_without_the_pads_the_default_target_is_batch_dependent():
    # The check above has teeth: the same model and text, scored in one call per batch with
    # llama.cpp's fast kernels, moves the logits (measured: 0.4-0.5 for k = 4-17).
    be = _backend("qwen2.5-coder-1.5b-instruct-q4_k_m", n_ctx=512, batch_consistent=False)
    try:
        assert be.kernels == BATCH_DEPENDENT
        prompt, cont = _text(be, 16)
        assert batch_noise(be, prompt, cont) > 0.01
    finally:
        be.close()


def test_a_full_context_still_fits_its_pads_and_nothing_more():
    be = _backend("smollm2-135m-instruct-q4_1", n_ctx=64, fixed_width=8)
    try:
        assert be.n_ctx == 64  # the pads' room is extra: the user keeps the context asked for
        filler = (be.tokenize(CODE * 4))[:60]
        be.decode(filler, 1)
        last = be.decode(filler[:4], 4)  # positions 60..63 real, 64..67 pads
        assert last.shape == (4, be.n_vocab) and np.isfinite(last).all()
        assert be.tokens == filler + filler[:4] and _cache_end(be) == 63
        with pytest.raises(ContextOverflowError):
            be.decode(filler[:1], 1)
        assert be.tokens == filler + filler[:4]  # a refused call changes nothing
    finally:
        be.close()


def test_a_width_outside_the_range_is_refused_before_loading():
    with pytest.raises(ConfigError, match="fixed width"):
        _backend("smollm2-135m-instruct-q4_1", fixed_width=-1)
    with pytest.raises(ConfigError, match="fixed width"):
        _backend("smollm2-135m-instruct-q4_1", n_batch=32, fixed_width=48)


@pytest.mark.slow
def test_greedy_speculation_equals_plain_decoding_at_a_fixed_width():
    # The default target at W = 4 (ggml-cpu's repacked GEMM for every call, not the single-token
    # GEMV the CPU pieces use): every drafter's greedy output is plain decoding's, token for token.
    with Engine.load(pair="default", drafter="auto", n_ctx=1024, fixed_width=4,
                     progress=False) as engine:
        assert engine.target.kernels == EXACT_FIXED_WIDTH
        assert engine.draft.kernels != EXACT_FIXED_WIDTH  # the draft's q is what it sampled from
        assert engine.costs.target.steady(1) == engine.costs.target.steady(4) < engine.costs.target.steady(5)
        prompt = "Add type hints to this function:\n\n" + CODE
        plain = ids(engine.complete(prompt, max_tokens=40, drafter="none", sampling=GREEDY))
        for name in ("lookup", "model", "auto"):
            spec = engine.complete(prompt, max_tokens=40, drafter=name, sampling=GREEDY,
                                   draft_length=None if name == "auto" else 6)
            assert ids(spec) == plain, name
            assert spec.stats.drafted > 0, name


def test_the_default_cpu_mode_is_the_pieces(tiny_engine):
    assert tiny_engine.target.kernels == EXACT_PIECES and tiny_engine.target.fixed_width == 0
