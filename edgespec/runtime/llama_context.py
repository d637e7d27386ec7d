"""One llama.cpp context on a loaded model: a KV cache, its exact record, and the decode calls.

:class:`LlamaContext` owns one ``llama_context`` (made from a :class:`ContextParams` record) and
keeps an exact record of what its KV cache holds (``tokens``: position i holds ``tokens[i]``),
so that the speculative loop can score k draft tokens in one decode and read just their rows,
roll the cache back to any prefix after a rejection (``sync``, ``trim``), and reuse the longest
common prefix between calls. A decode is split into ``llama_decode`` calls by a pure
:func:`edgespec.runtime.callplan.plan` (the prefill in batches, the rows read in the CPU's
batch-consistent pieces or padded to a fixed width); this module fills the batch from each call
and reads its outputs: rows of logits, or, with llama.cpp's backend sampler attached to the
sequence, each row's greedy pick or its top-k window, computed in the graph. A call can also be
launched and waited for later (``start_decode``/``finish_decode``), where llama.cpp's decode is
asynchronous (a GPU, RPC workers). Whatever fails or is interrupted mid-way empties the cache, so
the record is never silently wrong. The parameters are a record of their own so that a context of
another kind on the same model (a multi-token-prediction head's, ``LLAMA_CONTEXT_TYPE_MTP``, or
one keeping recurrent-state snapshots, ``n_rs_seq``) is one more field there and one more
instance here. A model with recurrent layers cannot drop a suffix of its cache at will: its
context keeps a :class:`~edgespec.runtime.recurrent.RecurrentMemory` (the reach of the last
call, checkpoints), through which every cut goes.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..core.lookup import common_prefix
from ..core.sampling import top_window
from ..errors import ContextOverflowError, ModelError
from . import callplan
from .callplan import Call
from .kernels import BATCH_DEPENDENT, EXACT_FIXED_WIDTH, EXACT_PIECES
from .llama_log import interrupts_deferred, recent_errors
from .llama_model import LlamaModel
from .recurrent import RecurrentMemory
from .rpc import DEFAULT_RPC_TIMEOUT_S

import llama_cpp  # noqa: E402  (after our own imports: llama_cpp prints on import errors)
from llama_cpp import _internals  # noqa: E402

#: Calls of up to this many tokens are filled one token at a time (LlamaContext._decode_picks).
_SCALAR_FILL = 8

#: Most rows one llama_decode call has llama.cpp's backend sampler pick from (a round of the
#: longest draft, 64, reads 65); a longer greedy batch is decoded in calls of this many rows.
MAX_SAMPLED_ROWS = 72


@dataclass(frozen=True)
class ContextParams:
    """How to make one context and shape its decode calls."""

    n_ctx: int  #: tokens the cache may hold (a fixed width's pads get room on top)
    n_batch: int  #: most tokens one llama_decode call takes
    n_threads: int = 1
    #: every decode call that reads logits is exactly this many tokens wide (0: off)
    fixed_width: int = 0
    #: calls that read logits take at most this many tokens, each row then going through a
    #: single token's CPU kernels (0: off; see ``backend.CONSISTENT_BATCH``)
    piece: int = 0
    flash_attention: bool = True  #: False: off (a single query's split-KV path differs)
    #: llama.cpp's backend sampler picks greedy tokens and draft windows in the graph
    backend_sampling: bool = True
    #: the model's output layer is on this machine's GPU: a draft window taken there never
    #: reaches the host (on the CPU, ggml's top-k, a partial sort of the whole row, measured
    #: no faster than the host's window)
    output_on_gpu: bool = False
    #: recurrent-state snapshots per sequence (llama.cpp's ``n_rs_seq``): how far back a model
    #: with recurrent layers can take its last call (:mod:`edgespec.runtime.recurrent`)
    snapshots: int = 0
    #: RPC workers that run the decode, watched for a decode outliving ``rpc_timeout`` seconds
    rpc: tuple[str, ...] = ()
    rpc_timeout: float = DEFAULT_RPC_TIMEOUT_S


def _llama_params(params: ContextParams):
    """llama.cpp's context parameters for ``params``."""
    cparams = llama_cpp.llama_context_default_params()
    # room for a full context's last call and its pads: the pads never cost the user context
    cparams.n_ctx = params.n_ctx + max(params.fixed_width - 1, 0)
    cparams.n_batch = params.n_batch
    cparams.n_ubatch = params.n_batch
    cparams.n_seq_max = 1
    cparams.n_threads = params.n_threads
    cparams.n_threads_batch = params.n_threads
    cparams.no_perf = True
    if params.backend_sampling and hasattr(cparams, "n_outputs_max_per_seq"):
        # a verification batch's rows are all sampled in the graph (default: one per call)
        cparams.n_outputs_max_per_seq = MAX_SAMPLED_ROWS
    if not params.flash_attention:
        cparams.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cparams.n_rs_seq = params.snapshots
    return cparams


def _create(model: LlamaModel, params: ContextParams) -> _internals.LlamaContext:
    """The llama.cpp context, Ctrl-C stopping its creation; :class:`ModelError` with llama.cpp's
    reason where it fails."""
    ctx = None
    try:
        with interrupts_deferred():
            ctx = _internals.LlamaContext(model=model.handle, params=_llama_params(params),
                                          verbose=True)
    except ValueError:
        reason = recent_errors() or "out of memory?"
        raise ModelError(f"failed to create a context of {params.n_ctx} tokens: {reason}") from None
    except BaseException:  # Ctrl-C: freed if it came too late
        if ctx is not None:
            ctx.close()
        raise
    return ctx


class LlamaContext:
    """One llama.cpp context on ``model``, with the KV cache contents tracked in ``tokens``."""

    _ctx: _internals.LlamaContext | None = None  #: None once freed
    _batch = None
    _watchdog = None
    _in_flight = False  #: a launched llama_decode not yet waited for
    _chain = None  #: the backend sampler chain attached now, if any
    _retired: Sequence = ()  #: chains detached since the last decode (freed after it)
    #: called after each llama_decode call is done, with the position of its first token and
    #: its tokens (pads too): an MTP head reads the target's hidden rows of that call then,
    #: before the next call overwrites them (:mod:`edgespec.runtime.sources.mtp`)
    on_call = None

    def __init__(self, model: LlamaModel, params: ContextParams) -> None:
        self.model = model
        self.params = params
        self._ctx = _create(model, params)
        try:
            self._init_batch(params)
            self._init_record(params)
            self._init_sampling(params)
        except BaseException:
            self.close()
            raise
        #: a model with recurrent layers: how its cache is cut (None: attention only)
        self.recurrent: RecurrentMemory | None = None
        if model.recurrent:
            self.recurrent = RecurrentMemory(self._ctx.ctx,
                                             llama_cpp.llama_n_rs_seq(self._ctx.ctx))
        if params.rpc:
            from .rpc import Watchdog

            self._watchdog = Watchdog(params.rpc, params.rpc_timeout)

    def _init_batch(self, params: ContextParams) -> None:
        """The batch one llama_decode call takes, and NumPy views over its C arrays: filling it
        is a few slice assignments. Every token is in sequence 0, set once here."""
        nb = params.n_batch
        self._batch = llama_cpp.llama_batch_init(nb, 0, 1)
        self._b_token = np.ctypeslib.as_array(self._batch.token, shape=(nb,))
        self._b_pos = np.ctypeslib.as_array(self._batch.pos, shape=(nb,))
        self._b_logits = np.ctypeslib.as_array(self._batch.logits, shape=(nb,))
        np.ctypeslib.as_array(self._batch.n_seq_id, shape=(nb,))[:] = 1
        for j in range(nb):
            self._batch.seq_id[j][0] = 0
        self._positions = np.arange(params.n_ctx + nb + params.fixed_width, dtype=np.int32)
        #: the batch's first rows that are flagged as outputs now (:meth:`_decode_picks`)
        self._outputs_flagged = 0
        self._view: np.ndarray | None = None
        self._view_key: tuple[int, int] | None = None
        self._gather: np.ndarray | None = None

    def _init_record(self, params: ContextParams) -> None:
        """The record of the cache, its size, and how decode calls are shaped."""
        width = params.fixed_width
        self.n_vocab: int = self.model.n_vocab
        # llama.cpp may pad the context and clamp the batch to it: use what it really has,
        # but never more context than was asked for.
        self.n_ctx: int = min(params.n_ctx,
                              llama_cpp.llama_n_ctx(self._ctx.ctx) - max(width - 1, 0))
        self.n_batch: int = min(llama_cpp.llama_n_batch(self._ctx.ctx),
                                llama_cpp.llama_n_ubatch(self._ctx.ctx))
        #: token ids held by the KV cache, position i holds tokens[i]
        self.tokens: list[int] = []
        #: width of every logit-reading decode call (0: as many tokens as the call has)
        self.fixed_width: int = width
        #: the most tokens one llama_decode call takes where every row's pick is read
        #: (:meth:`_decode_picks`; a fixed width's padded calls take the general path)
        self._picks_per_call: int = (0 if width else
                                     params.piece or min(MAX_SAMPLED_ROWS, self.n_batch))
        #: seconds spent inside llama_decode so far (to tell llama.cpp's time from Python's)
        self.decode_seconds = 0.0
        #: ``decode(..., unread=)`` skips rows' output projection (not at a fixed width)
        self.unread_rows: bool = not width
        #: what :meth:`finish_decode` reads: ``(picks, the call)`` of the launched call, or None
        self._launched: tuple[bool, Call] | None = None
        self._ready = None  #: a result :meth:`start_decode` computed at once

    def _init_sampling(self, params: ContextParams) -> None:
        """llama.cpp's backend sampling: a one-sampler chain attached to sequence 0 while its
        rows are decoded (attached, the raw logits are not copied out): greedy's pick, or a draft
        window's top-k."""
        self._attached: str | int | None = None  #: "argmax", a window's size, or None
        self._retired = []
        self.backend_argmax: bool = (params.backend_sampling
                                     and hasattr(llama_cpp, "llama_set_sampler"))
        #: a draft window (:meth:`decode_window`) is taken in llama.cpp's graph, and the rows
        #: never reach the host, where that is worth it (:attr:`ContextParams.output_on_gpu`)
        self.device_window: bool = self.backend_argmax and params.output_on_gpu

    @property
    def kernels(self) -> str:
        """How this context's logits relate to batch shape (:mod:`edgespec.runtime.kernels`):
        ``EXACT_PIECES`` (CPU kernels, pieces of ``params.piece``), ``EXACT_FIXED_WIDTH`` (every
        logit-reading call ``fixed_width`` wide) or ``BATCH_DEPENDENT``."""
        if self.fixed_width:
            return EXACT_FIXED_WIDTH
        return EXACT_PIECES if self.params.piece else BATCH_DEPENDENT

    @property
    def draft_reach(self) -> int | None:
        """The longest draft a round may score on this context: None where the cache drops any
        suffix (attention only); with recurrent layers, what one call's snapshots can take
        back (a round's [last, drafts] are then one call: at most a piece on the CPU), 0 where
        the model or build keeps none."""
        if self.recurrent is None:
            return None
        # (no fixed width here: a recurrent model refuses one)
        return max(min(self.recurrent.snapshots, self._picks_per_call - 1), 0)

    # ---- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Free the context (idempotent; before its model): a running decode is waited for
        first, and the sampler chains after the context that used them."""
        if self._in_flight and self._ctx is not None:
            self._settle()  # (nothing is freed under a running decode)
        if self._watchdog is not None:
            self._watchdog.close()
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None
        for chain in [self._chain, *self._retired]:
            if chain is not None:  # (after the context using it)
                llama_cpp.llama_sampler_free(chain)
        self._chain, self._retired = None, []

    # ---- KV cache --------------------------------------------------------------------------

    def sync(self, prefix: Sequence[int]) -> int:
        """Trim the KV cache to its longest common prefix with ``prefix``; return its length."""
        return self.trim(common_prefix(self.tokens, prefix))

    def trim(self, n: int) -> int:
        """Drop the cached tokens after the first ``n``; return how many stay cached (0 where a
        recurrent model cannot drop a suffix and starts over)."""
        if self._in_flight:
            self._settle()
        if n < len(self.tokens):
            if self.recurrent is not None:
                n = self.recurrent.cut(self._ctx.memory, len(self.tokens), n)
            elif not llama_cpp.llama_memory_seq_rm(self._ctx.memory, 0, n, -1):
                llama_cpp.llama_memory_clear(self._ctx.memory, True)
                n = 0
            del self.tokens[n:]
        return len(self.tokens)

    def reset(self) -> None:
        """Empty the KV cache."""
        if self._in_flight:
            self._settle()
        self._launched = self._ready = None
        llama_cpp.llama_memory_clear(self._ctx.memory, True)
        self.tokens.clear()
        if self.recurrent is not None:
            self.recurrent.clear()

    def _check_room(self, n: int) -> None:
        """:class:`ContextOverflowError` unless ``n`` more tokens fit in the context."""
        if len(self.tokens) + n > self.n_ctx:
            raise ContextOverflowError(
                f"{len(self.tokens) + n} tokens do not fit in the context of {self.n_ctx}")

    # ---- decoding --------------------------------------------------------------------------

    def decode(self, tokens: Sequence[int], n_logits: int,
               unread: Sequence[int] = ()) -> np.ndarray:
        """Append ``tokens`` to the KV cache; return logits of the last ``n_logits`` of them.

        The result has shape ``(n_logits, n_vocab)``, float32; row j predicts the token after
        ``tokens[len(tokens) - n_logits + j]``. Only those rows are computed by llama.cpp. It is
        read-only and only valid until the next ``decode`` or ``close``: when one llama_decode
        call produced every row, it is llama.cpp's own output buffer (no copy). Copy what you
        keep.

        ``unread``: rows (indices into the result) whose logits the caller will not read (a
        position a constraint leaves one token): llama.cpp skips their output projection, a
        fifth of a token's cost for the default target on a CPU, and their rows of the result
        hold nothing meaningful. The calls are split as with every row read, so the rows that
        are read, and the cache, are the same bits. Ignored at a fixed width (every row of
        a padded call is an output).
        """
        if n_logits and self._attached is not None:
            self._attach(None)
        return self._decode(tokens, n_logits, None, unread)

    def decode_argmax(self, tokens: Sequence[int], n_logits: int) -> list[int]:
        """Like :meth:`decode`, but return only each row's arg-max token id (a list of
        ``n_logits`` ints): greedy decoding's pick. With backend sampling (the default) llama.cpp
        computes it inside its graph, on the device that holds the output layer, and the
        rows never reach the host; ties go to the id ggml's ``argmax`` picks on that device
        (the last on the CPU). Otherwise it is NumPy's ``argmax`` of :meth:`decode`'s rows (the
        lowest id). Either way one backend gives one answer for the same logits, so greedy
        speculation and plain greedy decoding agree."""
        if n_logits and self.backend_argmax and self._attached != "argmax":
            self._attach("argmax")
        if n_logits and self._argmax_on:
            n = len(tokens)
            if n_logits == n and n <= self._picks_per_call:
                return self._decode_picks(tokens, n)
            return self._decode(tokens, n_logits, "argmax").tolist()
        return np.argmax(self.decode(tokens, n_logits), axis=1).tolist()

    def _decode_picks(self, tokens: Sequence[int], n: int, wait: bool = True) -> list[int] | None:
        """:meth:`decode_argmax` of ``n`` tokens that one llama_decode call takes, every row's
        pick read: a verification round's call, or a plain step's. It does what a plain loop
        over llama.cpp's C calls would, no more. On a GPU a token costs ~2 ms, and Python runs
        cold after each decode (code and data evicted): there each NumPy call the general path
        makes (the plan, output flags, slices, the result array) cost 10-40 µs, not the ~1 µs it
        costs in a warm loop. A few tokens go in through the batch's C arrays one by one.
        Without ``wait`` the call is only launched (:meth:`start_decode`)."""
        if self._in_flight:
            self._settle()
        self._check_room(n)
        start = len(self.tokens)
        batch = self._batch
        if n <= _SCALAR_FILL:
            token, pos = batch.token, batch.pos
            for j in range(n):
                token[j] = tokens[j]
                pos[j] = start + j
        else:
            self._b_token[:n] = tokens
            self._b_pos[:n] = self._positions[start:start + n]
        if self._outputs_flagged < n:
            self._b_logits[:n] = 1
            self._outputs_flagged = n
        batch.n_tokens = n
        try:
            self._call() if wait else self._launch()
            self.tokens += tokens
        except BaseException:
            # failed or interrupted (Ctrl-C) before the record says what the cache holds:
            # forget it all, as _decode does; the next sync() re-decodes the prompt
            self.reset()
            raise
        return self._sampled_ids(n) if wait else None

    def decode_window(self, tokens: Sequence[int], n_logits: int,
                      window: int) -> tuple[np.ndarray, np.ndarray]:
        """Like :meth:`decode`, but return only each row's ``window`` largest logits: ``(ids,
        logits)``, int32 and float32 arrays of shape ``(n_logits, window)`` (fewer columns if
        the vocabulary is smaller), in no particular order; ties at the window's edge are
        broken as the device's top-k breaks them. With backend sampling llama.cpp's own top-k
        sampler takes them inside its graph, and the rows never reach the host; otherwise
        NumPy takes them from :meth:`decode`'s rows. For a draft's proposals
        (:func:`edgespec.core.sampling.window_distribution`): any window is exact there."""
        window = min(window, self.n_vocab)
        if n_logits and window > 0 and self.backend_argmax and self._attached != window:
            self._attach(window)
        if n_logits and window > 0 and self._attached == window:
            return self._decode(tokens, n_logits, window)
        rows = self.decode(tokens, n_logits)
        if not n_logits or window <= 0:
            return np.empty((n_logits, 0), np.int32), np.empty((n_logits, 0), np.float32)
        return top_window(rows, window)

    # ---- a decode launched now, read later ---------------------------------------------------

    def start_decode(self, tokens: Sequence[int], n_logits: int, *, picks: bool = False) -> None:
        """Begin :meth:`decode` (:meth:`decode_argmax` with ``picks``) of ``tokens`` and, where
        llama.cpp's decode is asynchronous and one llama_decode call takes them all, return
        while the device computes; :meth:`finish_decode` waits and gives the result. The record
        of the cache holds ``tokens`` at once, so a decode whose result is never read is cut off
        by the next ``sync``. Any other call on this context waits for the device first (and a
        decode in between takes the place of this one's result: finish first). Otherwise (the
        CPU's exact pieces, more tokens than one call takes, no backend sampler for picks) the
        result is computed here, and kept for :meth:`finish_decode`. At a fixed width the call
        is padded as :meth:`decode` pads it, and the pads leave the cache's cells at once
        (llama.cpp's bookkeeping, not the device's: the launched graph is not touched)."""
        if self._in_flight:
            self._settle()
        n = len(tokens)
        self._launched = self._ready = None
        if picks and n_logits and self.backend_argmax and self._attached != "argmax":
            self._attach("argmax")
        if picks and n_logits == n and self._argmax_on and n <= self._picks_per_call:
            self._decode_picks(tokens, n, wait=False)
            self._launched = (True, Call(0, n, 0))
            return
        if not self._launchable(n, n_logits, picks):
            self._ready = self.decode_argmax(tokens, n_logits) if picks else self.decode(tokens, n_logits)
            return
        if not picks and self._attached is not None:
            self._attach(None)
        self._check_room(n)
        call = callplan.one_call(n, n_logits, width=self.fixed_width)
        self._launch_call(tokens, call)
        self._launched = (picks, call)

    def _launchable(self, n: int, n_logits: int, picks: bool) -> bool:
        """Whether one llama_decode call, launched and read later, gives what :meth:`decode`
        (or, with ``picks``, :meth:`decode_argmax`) would for ``n`` tokens: picks at a fixed
        width of every row; rows of logits in any one call but the CPU's pieces."""
        width = self.fixed_width
        if picks:
            return n_logits == n and self._argmax_on and 0 < n <= width
        if not 0 < n_logits <= n or self.params.piece:
            return False
        return 0 < n <= width and n_logits == n if width else n <= self.n_batch

    def _launch_call(self, tokens: Sequence[int], call: Call) -> None:
        """Launch ``call`` (all of ``tokens``) and record its tokens; its pads leave the cache's
        cells while it runs. A failure or an interrupt empties the cache (as in _decode_picks)."""
        start = len(self.tokens)
        self._fill(tokens, start, call)
        try:
            self._launch()
            if call.pads:
                # (while the call runs: the cells' bookkeeping only)
                self._drop_pads(start + call.stop)
            self.tokens += tokens
        except BaseException:
            self.reset()
            raise

    def finish_decode(self) -> list[int] | np.ndarray:
        """The result of the decode :meth:`start_decode` began, waited for: a list of picks, or
        the rows of logits (read-only, valid until the next decode, as :meth:`decode`'s)."""
        launched = self._launched
        if launched is None:
            ready, self._ready = self._ready, None
            if ready is None:
                raise RuntimeError("finish_decode without start_decode")
            return ready
        self._launched = None
        if self._in_flight:
            self._settle()
        picks, call = launched
        if picks:
            return self._sampled_ids(call.n_read)
        view = self._logits_view(call.n_outputs)
        return view if call.n_outputs == call.n_read else view[:call.n_read]

    # ---- llama.cpp's backend sampler ---------------------------------------------------------

    @property
    def _argmax_on(self) -> bool:
        return self._attached == "argmax"

    def _attach(self, kind: str | int | None) -> None:
        """Attach llama.cpp's greedy sampler (``"argmax"``), a top-k of ``kind`` (an int: a
        draft window), or nothing (``None``) to sequence 0. A context that cannot run one
        (e.g. split mode "tensor") gets NumPy's answers from then on."""
        if self._in_flight:
            self._settle()
        # A chain is initialised for its context once (llama.cpp aborts on a second
        # attach), so each attach makes a new one. A detached chain is freed at the next
        # change, once a decode has rebuilt the graph without it.
        for chain in self._retired:
            llama_cpp.llama_sampler_free(chain)
        self._retired = [self._chain] if self._chain is not None else []
        self._chain = None
        if kind is not None:
            chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
            sampler = (llama_cpp.llama_sampler_init_greedy() if kind == "argmax"
                       else llama_cpp.llama_sampler_init_top_k(int(kind)))
            llama_cpp.llama_sampler_chain_add(chain, sampler)
            self._chain = chain
        ok = llama_cpp.llama_set_sampler(self._ctx.ctx, 0, self._chain)
        if kind is not None and not ok:  # NumPy's answers from now on
            self.backend_argmax = self.device_window = False
            llama_cpp.llama_set_sampler(self._ctx.ctx, 0, None)
            kind = None
        self._attached = kind

    # ---- running a plan ----------------------------------------------------------------------

    def plan(self, n_tokens: int, n_logits: int, *, most_rows: int | None = None,
             unread: frozenset[int] = frozenset()) -> list[Call]:
        """The llama_decode calls of a decode of ``n_tokens`` that reads the last ``n_logits``
        rows, shaped as this context shapes them (:func:`edgespec.runtime.callplan.plan`)."""
        return callplan.plan(n_tokens, n_logits, batch=self.n_batch, width=self.fixed_width,
                             piece=self.params.piece, most_rows=most_rows, unread=unread)

    def _decode(self, tokens: Sequence[int], n_logits: int, sampled: str | int | None,
                unread: Sequence[int] = ()) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Decode ``tokens`` by the plan and read the last ``n_logits`` rows: their logits
        (``sampled`` None), the backend sampler's picks (``"argmax"``) or its top-k windows (an
        int, the window)."""
        if not 0 <= n_logits <= len(tokens):
            raise ValueError(f"n_logits={n_logits} for {len(tokens)} tokens")
        if self._in_flight:
            self._settle()
        self._check_room(len(tokens))
        # rows left unread: only where every output row is a read one (no pads, no sampler)
        skipped = (frozenset(unread) if unread and not self.fixed_width and sampled is None
                   else frozenset())
        calls = self.plan(len(tokens), n_logits, unread=skipped,
                          most_rows=None if sampled is None else MAX_SAMPLED_ROWS)
        try:
            if sampled == "argmax":
                result = self._run_picks(tokens, calls, n_logits)
            elif sampled is not None:
                return self._run_windows(tokens, calls, n_logits, sampled)
            else:
                result = self._run_logits(tokens, calls, n_logits, gather=bool(skipped))
        except BaseException:
            # Interrupted or failed mid-way: the cache may hold more than `tokens` says.
            # Forget it all; the next sync() re-decodes the prompt. Never silently wrong.
            self.reset()
            raise
        if result is None:
            return np.empty((0, self.n_vocab), np.float32)
        result.flags.writeable = False
        return result

    def _run(self, tokens: Sequence[int], start: int, call: Call) -> None:
        """One call of a plan, waited for: ``start`` is where the decode's tokens begin in the
        cache. Its pads leave the cache after it, and the record gains its tokens."""
        fed = tokens[call.start:call.stop]
        self._fill(fed, start + call.start, call)
        self._call()
        if call.pads:
            self._drop_pads(start + call.stop)
        self.tokens.extend(fed)
        if self.recurrent is not None and not call.reads:  # (a prefill call)
            self.recurrent.save(len(self.tokens))

    def _run_picks(self, tokens: Sequence[int], calls: list[Call], n_logits: int) -> np.ndarray:
        """Run the plan; the backend sampler's pick of each row read."""
        start = len(self.tokens)
        picks = np.empty(n_logits, np.int32)
        for call in calls:
            self._run(tokens, start, call)
            if call.reads:
                rows = slice(call.first_row, call.first_row + call.n_read)
                picks[rows] = self._sampled_ids(call.n_read, call.first_output)
        return picks

    def _run_windows(self, tokens: Sequence[int], calls: list[Call], n_logits: int,
                     window: int) -> tuple[np.ndarray, np.ndarray]:
        """Run the plan; the backend top-k's ``(ids, logits)`` of each row read."""
        start = len(self.tokens)
        out = (np.empty((n_logits, window), np.int32), np.empty((n_logits, window), np.float32))
        for call in calls:
            self._run(tokens, start, call)
            if call.reads:
                self._sampled_window(out, call)
        return out

    def _run_logits(self, tokens: Sequence[int], calls: list[Call], n_logits: int,
                    gather: bool) -> np.ndarray | None:
        """Run the plan; the logits of the rows read (None for none). Where one call gives every
        row (and none is left unread), llama.cpp's own buffer; otherwise (pieces, unread rows)
        the rows are gathered in a buffer of ours."""
        gather = gather or sum(call.reads for call in calls) > 1
        out = self._gather_rows(n_logits) if gather and n_logits else None
        start = len(self.tokens)
        for call in calls:
            self._run(tokens, start, call)
            if not call.reads:
                continue
            if call.unread:  # llama.cpp's outputs: the rows read, in order
                got = self._logits_view(call.n_outputs) if call.n_outputs else ()
                for row, logits in zip(call.output_rows(), got):
                    out[row] = logits
                continue
            first = call.first_output
            got = self._logits_view(call.n_outputs)[first:first + call.n_read]
            if out is None:
                out = got
            else:
                out[call.first_row:call.first_row + call.n_read] = got
        return out

    def _fill(self, tokens: Sequence[int], pos: int, call: Call) -> None:
        """Fill the batch for ``call``: ``tokens`` at positions from ``pos``, the rows from
        ``call.read_from`` on flagged as outputs but the unread ones; a padded call's pads are
        copies of the last token at the next positions, and its every row is an output."""
        size, width = len(tokens), call.width
        flags = self._b_logits
        self._b_token[:size] = tokens
        self._outputs_flagged = 0
        if call.pads:
            self._b_token[size:width] = self._b_token[size - 1]
            flags[:width] = 1
        else:
            flags[:call.read_from] = 0
            flags[call.read_from:size] = 1
            for j in call.unread:
                flags[j] = 0
        self._b_pos[:width] = self._positions[pos:pos + width]
        self._batch.n_tokens = width

    def _drop_pads(self, end: int) -> None:
        """Take a padded call's pads (the positions from ``end`` on) out of the cache."""
        if not llama_cpp.llama_memory_seq_rm(self._ctx.memory, 0, end, -1):
            raise ModelError("this model's cache cannot drop tokens (a recurrent model?): "
                             "it cannot run at a fixed width")

    # ---- llama_decode, launched and waited for ----------------------------------------------

    def _call(self) -> None:
        """One llama_decode of the batch as filled, waited for: a GPU decode is asynchronous,
        and its time must count as llama.cpp's (not as whoever first touches the outputs)."""
        self._launch()
        self._settle()

    def _launch(self) -> None:
        """One llama_decode of the batch as filled, not waited for (:meth:`_settle` does):
        llama.cpp builds the graph and queues it on the device, and returns. Each half counts
        as llama.cpp's time; the caller's work between them counts as nobody's. The RPC
        watchdog is armed while each half runs."""
        ctx = self._ctx.ctx
        watchdog = self._watchdog
        t0 = time.perf_counter()
        if watchdog is not None:
            watchdog.deadline = t0 + watchdog.timeout
        if self.recurrent is not None:
            self.recurrent.called(self._batch.n_tokens)
        self._in_flight = True  # (set first: a decode that failed mid-way is waited for too)
        try:
            rc = llama_cpp.llama_decode(ctx, self._batch)
        finally:
            if watchdog is not None:
                watchdog.deadline = None  # (a consumer may hold the stream for minutes)
        self.decode_seconds += time.perf_counter() - t0
        if rc != 0:
            raise ModelError(f"llama_decode failed with code {rc}")

    def _settle(self) -> None:
        """Wait for a launched decode (every other call on this context does so first)."""
        watchdog = self._watchdog
        t0 = time.perf_counter()
        if watchdog is not None:
            watchdog.deadline = t0 + watchdog.timeout
        try:
            llama_cpp.llama_synchronize(self._ctx.ctx)
        finally:
            if watchdog is not None:
                watchdog.deadline = None
        self._in_flight = False
        self.decode_seconds += time.perf_counter() - t0
        if self.on_call is not None:
            n = self._batch.n_tokens
            self.on_call(int(self._batch.pos[0]), self._b_token[:n])

    # ---- outputs of the last call -------------------------------------------------------------

    def _sampled_ids(self, n: int, first: int = 0) -> list[int]:
        """The backend sampler's picks for ``n`` outputs of the last call from ``first`` on."""
        get, ctx = llama_cpp.llama_get_sampled_token_ith, self._ctx.ctx
        picks = [get(ctx, first + j) for j in range(n)]
        if min(picks) < 0:  # LLAMA_TOKEN_NULL: nothing was sampled
            raise ModelError("llama.cpp's backend sampler returned no token")
        return picks

    def _sampled_window(self, out: tuple[np.ndarray, np.ndarray], call: Call) -> None:
        """The backend top-k's ids and logits for the rows ``call`` read, into their rows of
        ``out``."""
        ctx = self._ctx.ctx
        ids, logits = out
        width = ids.shape[1]
        for j in range(call.n_read):
            output, row = call.first_output + j, call.first_row + j
            n = llama_cpp.llama_get_sampled_candidates_count_ith(ctx, output)
            got_ids = llama_cpp.llama_get_sampled_candidates_ith(ctx, output)
            got_logits = llama_cpp.llama_get_sampled_logits_ith(ctx, output)
            if n != width or not got_ids or not got_logits or (
                    llama_cpp.llama_get_sampled_logits_count_ith(ctx, output) != width):
                raise ModelError(f"llama.cpp's backend top-k returned {n} of {width} candidates")
            ids[row] = np.ctypeslib.as_array(got_ids, shape=(width,))
            logits[row] = np.ctypeslib.as_array(got_logits, shape=(width,))

    def _logits_view(self, rows: int) -> np.ndarray:
        """llama.cpp's logits of the last call, ``(rows, n_vocab)``, without a copy."""
        ptr = llama_cpp.llama_get_logits(self._ctx.ctx)
        addr = ctypes.cast(ptr, ctypes.c_void_p).value
        key = (addr, rows)
        if self._view_key != key:
            view = np.ctypeslib.as_array(ptr, shape=(rows, self.n_vocab))
            view.flags.writeable = False
            self._view, self._view_key = view, key
        return self._view

    def _gather_rows(self, n: int) -> np.ndarray:
        if self._gather is None or self._gather.shape[0] < n:
            self._gather = np.empty((max(n, 8), self.n_vocab), np.float32)
        return self._gather[:n]  # a new view each time: writeable until handed out
