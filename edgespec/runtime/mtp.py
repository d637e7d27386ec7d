"""Drafting with a model's own multi-token-prediction (MTP, "nextn") layers, as llama.cpp's
``--spec-type draft-mtp`` does.

Some GGUF models (Qwen3.5/3.6 ``qwen35``, ``qwen35moe``, ...) carry, after their trunk, NextN
blocks (``<arch>.nextn_predict_layers`` > 0; tensors ``blk.<n_layer>.nextn.*``). llama.cpp loads
them only with ``llama_model_params.load_mtp`` and runs them in a *second context on the same
model* created with ``ctx_type = LLAMA_CONTEXT_TYPE_MTP``. That context's graph
(``LLM_GRAPH_TYPE_DECODER_MTP``) reads, for each batch entry, a token *and* a hidden-state row:
``h' = eh_proj(concat(rmsnorm(embed(x)), rmsnorm(h)))``, then one full-attention decoder block
with a KV cache of its own (a plain attention cache, even on the hybrid qwen35 whose trunk is
recurrent), then the shared norm and LM head: logits for the token after next, and its own
normed hidden state ``h_nextn`` to chain the next step.

Creating an MTP context on a model loaded *without* ``load_mtp`` aborts the process (the NextN
tensors were skipped; the graph asserts on them); on a model without NextN layers llama.cpp
returns NULL. Hence :func:`has_mtp` (the GGUF's metadata) before loading, and a model object
that remembers ``load_mtp`` (:func:`load_with_mtp`, or anything with ``.params.load_mtp``).

The protocol (``common/speculative.cpp``: ``common_speculative_impl_draft_mtp``, driven by
``examples/speculative-simple``), with ``h_p`` the target's hidden state after reading the
token at position ``p`` (``t_h_nextn``; for qwen35 the output-normed last layer, the row its
logits for position ``p+1`` come from):

* **Target.** Before each of its decodes (the prompt's, every verification), the target context
  is told ``llama_set_embeddings_nextn(ctx_tgt, true, masked=false)``: it then keeps ``h`` for
  *every* token of the batch, whatever the batch's logits flags, densely by batch index
  (``llama_get_embeddings_nextn`` / ``_ith(i)``; the buffer holds ``n_batch`` rows, so rows must
  be read after each ``llama_decode`` call, before the next). The MTP context is told
  ``llama_set_embeddings_nextn(ctx_mtp, true, masked=true)``: ``h_nextn`` only for the entries
  flagged as outputs. MTP context parameters: ``n_ctx`` of the target, ``n_rs_seq = 0``,
  ``ctx_other = ctx_tgt`` (used only by heads that share the target's KV: Gemma 4 assistants).
  The target itself is created with ``n_rs_seq = n_max`` (the longest draft): a hybrid target
  (qwen35's recurrent layers) can then drop up to that many rejected tokens from its cache.
* **Pairing.** The MTP cache holds at position ``p`` the pair ``(x_p, h_{p-1})``: the token at
  ``p`` with the target's hidden state one position *earlier* (position 0, and any position
  whose ``h_{p-1}`` is unknown, gets a zero row). So after each target decode of tokens at
  ``p0..p0+m-1`` (``process()``), the MTP context decodes the same tokens at the same
  positions, no outputs, with rows ``[pending, h_{p0}, ..., h_{p0+m-2}]``, where ``pending`` is
  ``h_{p0-1}`` carried over from the call before; ``pending`` then becomes ``h_{p0+m-1}``.
  After a verification (``accept(n_accepted)``), ``pending`` is reset to the row of the last
  accepted token, ``h`` of verification row ``n_accepted`` (row 0 is the round's first token,
  the one already committed; row i the i-th draft).
* **Drafting** (``draft()``), with ``n_past`` tokens committed to the target's cache and the
  newest token ``id_last`` (sampled, not yet decoded) at position ``n_past``: decode on the MTP
  context ``(id_last, pending = h_{n_past-1})`` at ``n_past``, flagged as output; its logits
  give draft 1 (greedy: the top-k-10 sampler's first candidate, i.e. the arg-max; drafting stops
  early where its probability < ``p_min``, 0 by default). Each next step decodes
  ``(draft_i, h_nextn of the MTP's previous output)`` at ``n_past + i`` and reads draft ``i+1``.
  One head is reused for every step (qwen35 asserts exactly one NextN block).
* **Chained heads** (step35: ``n_layer_nextn`` > 1 trained heads, KV not shared): step ``i``
  runs head ``i`` (``llama_set_nextn_layer_offset(ctx, i)``; offset 0 restored afterwards).
  Each head has its own KV layer, so the catch-up is decoded once per head (each after a
  ``seq_rm`` from the batch's first position), and draft step ``i`` removes the draft region
  (``seq_rm(pos0, -1)``) and re-decodes the whole prefix ``[id_last, d_1..d_i]`` with rows
  ``[pending, h'_1..h'_i]`` under head ``i``; the draft length is capped at the number of heads.
  Shared-KV heads (Gemma 4) skip the catch-up and decode every draft at the same position.
  :class:`MtpHead` implements the single-head mode only and refuses the others.
* **Cache.** Before the target verifies ``[id_last, d_1..d_k]``, the MTP cache is cut back to the
  target's (``seq_rm(ctx_mtp, n_past, -1)``): the drafting steps' entries go. The verification
  batch is then fed as above (catch-up, all k+1 tokens with the target's true rows), and after
  acceptance both caches are cut to the new ``n_past`` (``seq_rm(.., n_past + 1 + n_accepted,
  -1)``): the MTP cache keeps ``id_last`` and the accepted drafts, the rejected ones go, and the
  new ``id_last`` (the target's correction or bonus token) is fed at the next draft. Feeding only
  the accepted tokens, as :class:`MtpHead` lets a caller do, leaves the same cache (attention is
  causal: an entry depends only on those before it).

:class:`MtpHead` is that protocol over llama-cpp-python's ctypes API, independent of edgespec's
backend: it needs only the model (loaded with ``load_mtp``) and the target's ``llama_context``
pointer, and keeps the MTP cache's tokens and the ``pending`` row. A round with it::

    head = MtpHead(model, ctx_tgt)            # also turns on the target's hidden-state rows
    # target decodes context[:-1] (the prompt but its last token), in one or more calls:
    head.catch_up(context[:-1])               # after each call: that call's tokens
    d = head.draft(context[-1], k)            # d.tokens, d.logits / d.q (sampled)
    # target decodes [context[-1]] + d.tokens at len(context)-1.., judges, n accepted:
    head.catch_up([context[-1]] + d.tokens[:n])   # rows 0..n of that call (the first n+1)
    context += d.tokens[:n] + [correction]    # and on: head.draft(correction, k) ...

``catch_up`` reads the target's rows itself (from its last decode) unless given them, and cuts
its cache back first where ``pos`` is behind it (a text that changed). ``draft`` leaves the MTP
cache as it found it. Sampled drafts: ``draft(last, k, pick)`` with ``pick(row) -> (token, q)``
(the distribution the token was drawn from, for the exact rejection sampler) or ``None`` to stop;
``keep_logits=True`` also returns each step's raw logits. One MTP step costs one single-token
decode of one decoder block plus the LM head (the full vocabulary: the dominant part on small
models). The MTP context asks for at most one output row a ubatch (``n_outputs_max = 1``: a
5 MiB compute buffer instead of ~300 MiB of logits for the tiny model's 152k vocabulary).

scripts/mtp_reference.sh checks this against llama.cpp's own ``llama-speculative-simple
--spec-type draft-mtp`` (the same drafts and acceptances, round by round).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import llama_cpp
from llama_cpp import llama_cpp_ext

__all__ = ["MtpDraft", "MtpError", "MtpHead", "has_mtp", "load_with_mtp", "nextn_layers"]


class MtpError(RuntimeError):
    """The MTP head cannot be built or a call to it failed."""


def _pointer(model):
    """(the ``llama_model *``, whether it was loaded with ``load_mtp`` or None: unknown)."""
    for attr in ("handle", "_model"):  # edgespec's LlamaModel, llama_cpp.Llama
        inner = getattr(model, attr, None)
        if inner is not None and not isinstance(inner, (int, ctypes.c_void_p)):
            return _pointer(inner)
    if hasattr(model, "model") and hasattr(model, "params"):  # llama_cpp._internals.LlamaModel
        return model.model, bool(getattr(model.params, "load_mtp", False))
    return model, None


def nextn_layers(path_or_model) -> int:
    """How many MTP (NextN) layers the GGUF file or loaded model declares
    (``<arch>.nextn_predict_layers``; 0 without)."""
    if isinstance(path_or_model, (str, os.PathLike)):
        from ..models.gguf_meta import arch_of

        return arch_of(path_or_model).mtp_layers
    ptr, _ = _pointer(path_or_model)
    return int(llama_cpp.llama_model_n_layer_nextn(ptr))


def has_mtp(path_or_model) -> bool:
    """Whether the GGUF file (a path) or loaded model has MTP layers to draft with. For a loaded
    model known to have been loaded without ``load_mtp`` (``.params.load_mtp`` false): False,
    since an MTP context on it would abort the process."""
    if nextn_layers(path_or_model) <= 0:
        return False
    if isinstance(path_or_model, (str, os.PathLike)):
        return True
    return _pointer(path_or_model)[1] is not False


def load_with_mtp(path: str | os.PathLike, *, n_gpu_layers: int = 0, verbose: bool = False):
    """The model at ``path`` loaded with its MTP layers (a ``llama_cpp._internals.LlamaModel``,
    which :class:`MtpHead` and :func:`has_mtp` accept; ``.model`` is the pointer). Raises
    :class:`MtpError` where the file has none."""
    from llama_cpp import _internals

    if not has_mtp(path):
        raise MtpError(f"{path} has no MTP layers (<arch>.nextn_predict_layers)")
    from .llama_model import model_params

    params, _, keep = model_params()
    params.n_gpu_layers = n_gpu_layers
    params.load_mtp = True
    model = _internals.LlamaModel(path_model=str(Path(path)), params=params, verbose=verbose)
    model._edgespec_devices = keep  # (the array outlives the load)
    return model


@dataclass
class MtpDraft:
    """What one :meth:`MtpHead.draft` proposed."""

    tokens: list[int] = field(default_factory=list)
    #: each drafted token's row of raw logits (float32, n_vocab), where asked for
    logits: list[np.ndarray] = field(default_factory=list)
    #: what ``pick`` returned beside each token (e.g. the distribution it sampled from)
    q: list[object] = field(default_factory=list)


#: picks a draft token from a row of logits (a view valid only during the call): the token, a
#: (token, extra) pair whose extra goes to :attr:`MtpDraft.q`, or None to stop drafting
Pick = Callable[[np.ndarray], "int | tuple[int, object] | None"]


class MtpHead:
    """An MTP context on a target's model, kept in step with the target's committed tokens.

    ``model``: the target's model, loaded with ``load_mtp`` (:func:`load_with_mtp`'s, an
    ``_internals.LlamaModel``, edgespec's ``LlamaModel``, a ``llama_cpp.Llama``, or a bare
    ``llama_model *`` which the caller vouches for). ``target``: the target's ``llama_context *``
    (or an object whose ``.ctx`` it is).
    The context is as long as the target's and decodes with its thread counts. ``keep_rows``:
    how many of the target's last hidden rows are kept for :meth:`rollback` (further back, the
    pair's row is zero: a weaker draft at one position, never a wrong text).

    Free it (:meth:`close`, or ``with``) before the target's context and the model.
    """

    def __init__(self, model, target, *, n_ctx: int | None = None, n_batch: int | None = None,
                 n_threads: int | None = None, keep_rows: int = 256,
                 enable_target: bool = True) -> None:
        self.ctx = None
        self._batch = None
        target = getattr(target, "ctx", target)  # (an _internals.LlamaContext: its pointer)
        ptr, loaded = _pointer(model)
        if loaded is False:
            raise MtpError("the model was loaded without load_mtp: an MTP context would abort")
        if not ptr:
            raise MtpError("no model")
        self.model = ptr
        self.target = target
        self.n_heads = int(llama_cpp.llama_model_n_layer_nextn(ptr))
        if self.n_heads <= 0:
            raise MtpError("the model has no MTP layers")
        if self.n_heads > 1:
            raise MtpError(f"{self.n_heads} chained MTP heads: only single-head models "
                           "(qwen35, qwen35moe) are supported")
        self.n_embd = int(llama_cpp.llama_model_n_embd_out(ptr))
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(ptr)))
        params = llama_cpp.llama_context_default_params()
        params.ctx_type = llama_cpp.LLAMA_CONTEXT_TYPE_MTP
        params.n_ctx = n_ctx or llama_cpp.llama_n_ctx(target)
        params.n_batch = n_batch or llama_cpp.llama_n_batch(target)
        params.n_ubatch = min(params.n_batch, llama_cpp.llama_n_ubatch(target))
        params.n_seq_max = 1
        params.n_rs_seq = 0
        params.n_outputs_max = 1  # one row a draft step, none a catch-up: a small buffer
        threads = n_threads or llama_cpp.llama_n_threads(target)
        params.n_threads = threads
        params.n_threads_batch = n_threads or llama_cpp.llama_n_threads_batch(target)
        params.embeddings = False
        params.ctx_other = target
        ctx = llama_cpp.llama_init_from_model(ptr, params)
        if not ctx:
            raise MtpError("llama.cpp could not create the MTP context")
        self.ctx = ctx
        self.n_ctx = int(llama_cpp.llama_n_ctx(ctx))
        self.n_batch = int(llama_cpp.llama_n_batch(ctx))
        llama_cpp_ext.llama_set_embeddings_nextn(ctx, True, True)
        self._batch = llama_cpp.llama_batch_ext_init(ctx)
        self._mem = llama_cpp.llama_get_memory(ctx)
        self._pos = (llama_cpp.llama_pos * 4)()
        #: the tokens the MTP cache holds, position i holding tokens[i]
        self.tokens: list[int] = []
        self.keep_rows = max(1, keep_rows)
        self._rows = np.zeros((self.keep_rows, self.n_embd), np.float32)  # h_p at p % keep_rows
        self._pending = np.zeros(self.n_embd, np.float32)  # h_{n_past-1}
        self._zero = np.zeros(self.n_embd, np.float32)
        if enable_target:
            self.enable_target()

    # -- the target's side

    def enable_target(self, on: bool = True) -> None:
        """Tell the target context to keep every batch token's hidden state (or no more)."""
        llama_cpp_ext.llama_set_embeddings_nextn(self.target, bool(on), False)

    def target_rows(self, n: int) -> np.ndarray:
        """The target's hidden rows for the first ``n`` tokens of its last decode call (a copy,
        ``(n, n_embd)`` float32). Needs :meth:`enable_target` before that call."""
        if n <= 0:
            return np.zeros((0, self.n_embd), np.float32)
        ptr = llama_cpp_ext.llama_get_embeddings_nextn(self.target)
        if not ptr:
            raise MtpError("the target kept no hidden states (enable_target before its decode)")
        return np.ctypeslib.as_array(ptr, shape=(n, self.n_embd)).copy()

    # -- the MTP cache

    @property
    def n_past(self) -> int:
        """Positions the MTP cache holds (the target's committed tokens it has read)."""
        return len(self.tokens)

    def catch_up(self, tokens: Sequence[int], rows: np.ndarray | None = None,
                 pos: int | None = None) -> None:
        """Feed the tokens the target has committed at positions ``pos..`` (default: where the
        MTP cache ends; behind it, the cache is cut back there first), with the target's hidden
        rows for them (``rows[i]`` = ``h`` after reading ``tokens[i]``; default: the first
        ``len(tokens)`` rows of the target's last decode call)."""
        tokens = [int(t) for t in tokens]
        if pos is not None and pos != self.n_past:
            if pos > self.n_past:
                raise MtpError(f"catch_up at {pos}: the MTP cache ends at {self.n_past}")
            self.rollback(pos)
        if not tokens:
            return
        if rows is None:
            rows = self.target_rows(len(tokens))
        rows = np.ascontiguousarray(rows, dtype=np.float32).reshape(-1, self.n_embd)
        if len(rows) != len(tokens):
            raise MtpError(f"{len(tokens)} tokens, {len(rows)} hidden rows")
        if self.n_past + len(tokens) > self.n_ctx:
            raise MtpError("the MTP context is full")
        inputs = np.empty((len(tokens), self.n_embd), np.float32)
        inputs[0] = self._pending
        inputs[1:] = rows[:-1]
        p0 = self.n_past
        for start in range(0, len(tokens), self.n_batch):
            end = min(start + self.n_batch, len(tokens))
            self._clear()
            for i in range(start, end):
                self._add(tokens[i], p0 + i, inputs[i], output=False)
            self._process()
        for i, row in enumerate(rows[-self.keep_rows:], p0 + max(0, len(rows) - self.keep_rows)):
            self._rows[i % self.keep_rows] = row
        self._pending = rows[-1].copy()
        self.tokens.extend(tokens)

    def rollback(self, n_past: int) -> None:
        """Keep the first ``n_past`` positions of the MTP cache, drop the rest."""
        n_past = max(0, min(n_past, self.n_past))
        if n_past == self.n_past:
            return
        llama_cpp.llama_memory_seq_rm(self._mem, 0, n_past, -1)
        kept = n_past > 0 and self.n_past - n_past < self.keep_rows
        self._pending = self._rows[(n_past - 1) % self.keep_rows].copy() if kept else \
            self._zero.copy()
        del self.tokens[n_past:]

    def reset(self) -> None:
        """Forget everything (a new text)."""
        llama_cpp.llama_memory_clear(self._mem, True)
        self.tokens.clear()
        self._pending = self._zero.copy()

    # -- drafting

    def draft(self, last: int, k: int, pick: Pick | None = None, *,
              keep_logits: bool = False) -> MtpDraft:
        """Up to ``k`` tokens to follow the committed text, whose newest token ``last`` (at
        position :attr:`n_past`, not in the target's cache yet) is fed first. Greedy (each
        row's arg-max, lowest id on ties) unless ``pick`` chooses; ``keep_logits``: a copy of
        each drafted token's logits row in the result. The MTP cache is left as it was."""
        out = MtpDraft()
        k = min(k, self.n_ctx - self.n_past)
        if k <= 0:
            return out
        p0 = self.n_past
        try:
            self._clear()
            self._add(int(last), p0, self._pending, output=True)
            for i in range(k):
                self._process()
                ptr = llama_cpp.llama_get_logits_ith(self.ctx, 0)
                row = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
                if pick is None:
                    token, extra = int(np.argmax(row)), None
                else:
                    chosen = pick(row)
                    if chosen is None:
                        break
                    token, extra = chosen if isinstance(chosen, tuple) else (int(chosen), None)
                out.tokens.append(int(token))
                out.q.append(extra)
                if keep_logits:
                    out.logits.append(row.copy())
                if i + 1 < k:
                    h = llama_cpp_ext.llama_get_embeddings_nextn_ith(self.ctx, 0)
                    h = np.ctypeslib.as_array(h, shape=(self.n_embd,))
                    self._clear()
                    self._add(int(token), p0 + i + 1, h, output=True)
        finally:
            llama_cpp.llama_memory_seq_rm(self._mem, 0, p0, -1)
        return out

    # -- ctypes plumbing

    def _clear(self) -> None:
        llama_cpp.llama_batch_ext_clear(self._batch)

    def _add(self, token: int, pos: int, h: np.ndarray, *, output: bool) -> None:
        idx = llama_cpp.llama_batch_ext_add_token(self._batch, 0, token)
        if idx < 0:
            raise MtpError(f"cannot add token {token} to the MTP batch ({idx})")
        self._pos[0] = pos
        llama_cpp.llama_batch_ext_set_pos(self._batch, idx, self._pos)
        h = np.ascontiguousarray(h, dtype=np.float32)
        embd = llama_cpp.llama_embd(h.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1,
                                    self.n_embd)
        if not llama_cpp.llama_batch_ext_set_embd_token(self._batch, idx, embd):
            raise MtpError("the MTP batch refused a hidden-state row")  # (copied: h may go)
        if output:
            llama_cpp.llama_batch_ext_set_output_logits(self._batch, idx, True)

    def _process(self) -> None:
        rc = llama_cpp.llama_process(self.ctx, llama_cpp.LLAMA_PROCESS_TYPE_DECODE, self._batch)
        if rc != 0:
            raise MtpError(f"llama_process on the MTP context returned {rc}")

    # -- lifetime

    def close(self) -> None:
        """Free the MTP context (before the target's context and the model). The target keeps
        its hidden-state setting: it may be gone already."""
        if self._batch is not None:
            llama_cpp.llama_batch_ext_free(self._batch)
            self._batch = None
        if self.ctx is not None:
            llama_cpp.llama_free(self.ctx)
            self.ctx = None

    def __enter__(self) -> "MtpHead":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
