"""The MTP head (``edgespec.runtime.mtp``): a model's own NextN layers drafting in a context of
their own, fed the target's hidden states. On the synthetic Qwen3.5 with an MTP block (random
weights: acceptance means nothing here, determinism and bookkeeping do); ``has_mtp`` on a model
without one. The comparison with llama.cpp's own ``draft-mtp`` is scripts/mtp_reference.sh."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time, in a small village,"
QWEN25 = Path.home() / ".cache/edgespec/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def test_has_mtp_false_without_nextn_layers():
    from edgespec.runtime.mtp import has_mtp, nextn_layers

    if not QWEN25.exists():
        pytest.skip("qwen2.5-coder-0.5b not cached")
    assert nextn_layers(QWEN25) == 0
    assert not has_mtp(QWEN25)
    assert not has_mtp(str(QWEN25))


# ----------------------------------------------------------------- on the synthetic model

@pytest.fixture(scope="module")
def mtp_path():
    from edgespec.models import synthetic

    return synthetic.cached("qwen35-tiny", mtp=True)


class Target:
    """A bare target context on the model (what edgespec's backend is, minus everything)."""

    def __init__(self, model, n_ctx=512, n_batch=512):
        import llama_cpp

        self.llama_cpp = llama_cpp
        p = llama_cpp.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch = n_ctx, n_batch, n_batch
        p.n_threads = p.n_threads_batch = 2
        p.n_seq_max = 1
        p.n_rs_seq = 4  # qwen35's recurrent state rolls back this far
        self.ctx = llama_cpp.llama_init_from_model(model, p)
        assert self.ctx
        self.batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
        self.vocab = llama_cpp.llama_model_get_vocab(model)

    def tokenize(self, text):
        raw = text.encode()
        buf = (self.llama_cpp.llama_token * (len(raw) + 16))()
        n = self.llama_cpp.llama_tokenize(self.vocab, raw, len(raw), buf, len(buf), True, True)
        return list(buf[:n])

    def decode(self, tokens, pos0):
        b = self.batch
        b.n_tokens = len(tokens)
        for i, t in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, pos0 + i, 1, True
            b.seq_id[i][0] = 0
        assert self.llama_cpp.llama_decode(self.ctx, b) == 0
        ptr = self.llama_cpp.llama_get_logits(self.ctx)
        return np.ctypeslib.as_array(ptr, shape=(len(tokens), self.n_vocab)).copy()

    def rm(self, pos):
        assert self.llama_cpp.llama_memory_seq_rm(self.mem, 0, pos, -1)

    def close(self):
        self.llama_cpp.llama_batch_free(self.batch)
        self.llama_cpp.llama_free(self.ctx)


@pytest.fixture(scope="module")
def loaded(mtp_path):
    from edgespec.runtime.mtp import load_with_mtp

    model = load_with_mtp(mtp_path)
    yield model
    model.close()


@pytest.fixture
def setup(loaded):
    """(head, target, prompt tokens) with the prompt but its last token read by both."""
    from edgespec.runtime.mtp import MtpHead

    target = Target(loaded.model)
    head = MtpHead(loaded, target.ctx)
    toks = target.tokenize(PROMPT)
    target.decode(toks[:-1], 0)
    head.catch_up(toks[:-1])
    yield head, target, toks
    head.close()
    target.close()


@pytest.mark.real
def test_has_mtp_on_the_synthetic_model(mtp_path, loaded):
    from edgespec.models import synthetic
    from edgespec.runtime.mtp import has_mtp, nextn_layers

    assert has_mtp(mtp_path) and nextn_layers(mtp_path) == 1
    assert has_mtp(loaded)  # loaded with load_mtp
    assert not has_mtp(synthetic.cached("qwen35-tiny"))


@pytest.mark.real
def test_a_model_loaded_without_load_mtp_is_refused(mtp_path):
    """An MTP context on it would abort the process: refused before llama.cpp is asked."""
    from edgespec.runtime.mtp import MtpError, MtpHead, has_mtp

    from edgespec.runtime.llama_model import LlamaModel

    # (edgespec's load: this machine's devices, never an RPC worker an earlier test left)
    model = LlamaModel(Path(mtp_path))
    try:
        assert not has_mtp(model)
        target = Target(model.handle.model)
        with pytest.raises(MtpError, match="load_mtp"):
            MtpHead(model, target.ctx)
        target.close()
    finally:
        model.close()


@pytest.mark.real
def test_greedy_drafts_are_deterministic_and_leave_the_cache_as_it_was(setup):
    head, target, toks = setup
    n_past = head.n_past
    assert n_past == len(toks) - 1 and head.tokens == toks[:-1]
    a = head.draft(toks[-1], 4, keep_logits=True)
    b = head.draft(toks[-1], 4, keep_logits=True)
    assert len(a.tokens) == 4
    assert a.tokens == b.tokens
    assert all(np.array_equal(x, y) for x, y in zip(a.logits, b.logits))
    assert head.n_past == n_past and head.tokens == toks[:-1]
    # greedy: each token is its row's arg-max, and a shorter draft is a prefix of a longer one
    assert a.tokens == [int(np.argmax(row)) for row in a.logits]
    for k in (1, 2, 3):
        assert head.draft(toks[-1], k).tokens == a.tokens[:k]
    assert len(set(a.tokens)) > 1  # not one token repeated


@pytest.mark.real
def test_a_second_head_on_the_same_model_drafts_the_same(setup, loaded):
    from edgespec.runtime.mtp import MtpHead

    head, target, toks = setup
    rows = np.stack([row for row in _rows_of_prompt(loaded, toks)])
    with MtpHead(loaded, target.ctx) as other:
        other.catch_up(toks[:10], rows[:10])  # in two pieces: the pending row carries over
        other.catch_up(toks[10:-1], rows[10:])
        assert other.draft(toks[-1], 4).tokens == head.draft(toks[-1], 4).tokens


def _rows_of_prompt(loaded, toks):
    """The target's hidden rows for the prompt but its last token, from a fresh context."""
    from edgespec.runtime.mtp import MtpHead

    t = Target(loaded.model)
    try:
        with MtpHead(loaded, t.ctx) as h:  # (turns the target's rows on)
            t.decode(toks[:-1], 0)
            return h.target_rows(len(toks) - 1)
    finally:
        t.close()


@pytest.mark.real
def test_a_round_then_rollback_drafts_again_as_before(setup):
    """Play a verification round (catch up on what the target accepted), then roll both back:
    the head drafts what it drafted before the round; catch up again: as after the round."""
    head, target, toks = setup
    n0, last = head.n_past, toks[-1]
    before = head.draft(last, 3).tokens
    rows = target.decode([last] + before, n0)  # the target scores [last] + drafts
    fed = [last] + before[:2]  # say two drafts were accepted
    head.catch_up(fed)  # rows 0..2 of that call
    assert head.n_past == n0 + 3
    nxt = int(np.argmax(rows[2]))
    after = head.draft(nxt, 3).tokens
    h_rows = head.target_rows(4)

    head.rollback(n0)
    assert head.n_past == n0 and head.tokens == toks[:-1]
    assert head.draft(last, 3).tokens == before
    head.catch_up(fed, h_rows[:3])
    assert head.draft(nxt, 3).tokens == after
    # feeding the whole verified batch then cutting back (llama.cpp's way) leaves the same
    head.catch_up([last] + before, h_rows, pos=n0)  # (pos behind the cache: cut back first)
    head.rollback(n0 + 3)
    assert head.draft(nxt, 3).tokens == after
    target.rm(n0)


@pytest.mark.real
def test_sampled_drafts_follow_pick_and_stop_where_it_says(setup):
    head, target, toks = setup
    seen = []

    def pick(row):
        p = np.exp(row - row.max())
        p /= p.sum()
        seen.append(p)
        x = int(rng.choice(len(p), p=p))
        return x, p

    rng = np.random.default_rng(7)
    a = head.draft(toks[-1], 4, pick)
    rng = np.random.default_rng(7)
    b = head.draft(toks[-1], 4, pick)
    assert a.tokens == b.tokens and len(a.q) == 4
    assert all(q is not None and abs(q.sum() - 1) < 1e-5 for q in a.q)
    calls = iter([5, 6, None, 7])
    c = head.draft(toks[-1], 4, lambda row: next(calls))
    assert c.tokens == [5, 6] and c.q == [None, None]


@pytest.mark.real
def test_reset_and_close(setup, loaded):
    from edgespec.runtime.mtp import MtpHead

    head, target, toks = setup
    head.reset()
    assert head.n_past == 0 and head.tokens == []
    assert len(head.draft(toks[0], 2).tokens) == 2  # from nothing: a zero row, no crash
    extra = MtpHead(loaded, target.ctx)
    extra.close()
    extra.close()  # twice: nothing
    del extra
