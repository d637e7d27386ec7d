"""The only module that calls into llama-cpp-python.

It loads a GGUF model into a llama.cpp context and keeps an exact record of what the context's
KV cache holds (``tokens``), so that the speculative loop can:

- score k draft tokens in one ``llama_decode`` call and get logits for just those positions
  (never ``logits_all``: memory stays at n_outputs x n_vocab, not n_ctx x n_vocab);
- roll the KV cache back to any prefix after a rejection (``sync``);
- reuse the longest common prefix between calls (multi-turn chat re-decodes only what changed).

Batch consistency: on the CPU, llama.cpp picks different matmul kernels by batch size (repacked
Q4_K weights use a GEMV for fewer than 4 rows and a GEMM otherwise; a tiled K-quant matmul takes
over from 8 rows; llamafile's sgemm only runs for 2+ rows; flash attention splits the KV for a
single query). A token scored alone and the same token scored inside a verification batch then
get slightly different logits, and a near-tie can flip. ``ModelOptions(batch_consistent=True)``
(the default) turns flash attention off and scores logit-reading batches in pieces of at most
``CONSISTENT_BATCH`` tokens, which go through the single-token kernels; :func:`system_info`
reports whether the llama.cpp build has llamafile's sgemm compiled in (edgespec's setup builds it
without). See README, "Exactness".

On a GPU the pieces would not help (CUDA picks its kernels by batch width at every width) and
would cost the batch scoring speculation lives on. There ``ModelOptions(fixed_width=W)`` makes
every decode call that reads logits exactly W tokens wide: the real tokens, then throw-away
copies at later positions of the same sequence (causally masked out of the real rows), logits for
all W rows (the output projection's kernel follows the number of output rows too), and the pads
removed from the KV cache afterwards. Every call then has one shape, so a token's logits do not
depend on how many real tokens shared its call. :attr:`LlamaBackend.kernels` names the mode.

On a GPU (and through RPC workers) llama_decode returns once the graph is queued on the device.
:meth:`LlamaBackend.start_decode` returns there, and :meth:`LlamaBackend.finish_decode` waits:
the loop launches a round's call before it hands the last round to its caller, whose work then
overlaps the device's (see :func:`edgespec.runtime.loop.rounds`).
"""

from __future__ import annotations

import ctypes
import functools
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..core.lookup import common_prefix
from ..core.sampling import top_window
from ..errors import ConfigError, ContextOverflowError, IncompatibleDraftError, ModelError
from .kernels import BATCH_DEPENDENT, EXACT_FIXED_WIDTH, EXACT_PIECES, flash_attention_off
from .llama_log import interrupts_deferred, set_verbose  # noqa: F401  (set_verbose re-exported)
from .llama_log import load_failure_reason, load_progress, recent_errors, take_log_lines
from .rpc import DEFAULT_RPC_TIMEOUT_S

import llama_cpp  # noqa: E402  (after our own imports: llama_cpp prints on import errors)
from llama_cpp import _internals  # noqa: E402

#: llama.cpp compares this many token texts, skipping the first few special ids; so do we,
#: but over the whole shared vocabulary.
_MAX_VOCAB_SIZE_DIFFERENCE = 128

#: Largest decode batch whose logits use the same kernels as a single token (llamafile and
#: flash attention off): with repacked weights, ggml-cpu's repacked GEMV runs up to 3 rows and a
#: GEMM from 4; without repacking, the generic path runs up to 7 rows and a tiled K-quant
#: matmul from 8.
CONSISTENT_BATCH = {True: 3, False: 7}

#: Calls of up to this many tokens are filled one token at a time (LlamaBackend._decode_picks).
_SCALAR_FILL = 8

#: Most rows one llama_decode call has llama.cpp's backend sampler pick from (a round of the
#: longest draft, 64, reads 65); a longer greedy batch is decoded in calls of this many rows.
MAX_SAMPLED_ROWS = 72

def system_info() -> dict[str, str]:
    """llama.cpp's build features, e.g. {'AVX512': '1', 'LLAMAFILE': '0', ...}."""
    text = llama_cpp.llama_print_system_info().decode("utf-8", errors="replace")
    info: dict[str, str] = {}
    for part in text.split("|"):
        key, sep, value = part.rpartition("=")
        if sep:
            info[key.split(":")[-1].strip()] = value.strip()
    return info


#: llama.cpp build features that run for 2+ rows only, so that a batch's logits differ from one
#: token's: llamafile's sgemm, and Intel AMX (ggml-cpu multiplies a single row with AVX512-VNNI,
#: more rows with AMX tiles). edgespec's setup builds without both.
BATCH_SHAPED_FEATURES = ("LLAMAFILE", "AMX_INT8")


def inconsistent_features(info: dict[str, str] | None = None) -> list[str]:
    """The features of :data:`BATCH_SHAPED_FEATURES` this llama.cpp build has compiled in."""
    info = system_info() if info is None else info
    return [name for name in BATCH_SHAPED_FEATURES if info.get(name, "0") != "0"]


def consistent_build() -> bool:
    """True if llama.cpp was built without llamafile's sgemm and without AMX (each runs for 2+
    rows only, and so makes a batch's logits differ from one token's). edgespec's setup builds
    it that way."""
    return not inconsistent_features()


def gpu_offload_supported() -> bool:
    """Whether this machine has a GPU llama.cpp can offload layers to (``llama_supports_gpu_offload``
    also says yes for a build with RPC, which offloads to workers, not here)."""
    from .rpc import local_devices

    try:
        return any(d.kind in ("GPU", "IGPU") for d in local_devices())
    except (OSError, AttributeError, ModelError):
        return bool(llama_cpp.llama_supports_gpu_offload())


def offloads_locally(n_gpu_layers: int, rpc: Sequence[str]) -> bool:
    """Whether a model loaded with these settings puts layers on this machine's GPU, where
    kernels follow the batch width (no RPC workers: the layers would go to them)."""
    return n_gpu_layers != 0 and not rpc and gpu_offload_supported()


@dataclass(frozen=True)
class ModelOptions:
    """How to load one GGUF model. ``n_gpu_layers=-1`` offloads every layer."""

    path: Path
    n_gpu_layers: int = 0
    n_threads: int = 1
    n_ctx: int = 4096
    n_batch: int = 512
    batch_consistent: bool = True
    repack: bool = True  #: llama.cpp's repacked CPU weights (faster; see CONSISTENT_BATCH)
    #: RPC workers (``HOST:PORT``) whose devices take the offloaded layers (``edgespec worker``)
    rpc: tuple[str, ...] = ()
    rpc_timeout: float = DEFAULT_RPC_TIMEOUT_S  #: seconds one decode on the workers may take
    #: how the offloaded layers are shared among the devices, in :func:`offload_devices` order
    tensor_split: tuple[float, ...] = ()
    #: greedy picks (:meth:`LlamaBackend.decode_argmax`) run in llama.cpp's graph, on the
    #: device holding the output layer, and a greedy row's logits never reach the host
    backend_sampling: bool = True
    #: every decode call that reads logits is exactly this many tokens wide (pads removed after
    #: it): batch-consistent logits on any device, at the cost of a W-wide call per plain step.
    #: 0 = off (the CPU pieces when ``batch_consistent``, else batch-dependent)
    fixed_width: int = 0


def parse_tensor_split(text: str | Sequence[float] | None) -> tuple[float, ...]:
    """``"3,1"`` (or numbers) as weights, one per device; :class:`ConfigError` unless each is a
    finite number >= 0 and one is > 0."""
    if text is None or text == "" or (not isinstance(text, str) and not len(text)):
        return ()
    items = text.split(",") if isinstance(text, str) else list(text)
    try:
        weights = tuple(float(w) for w in items)
    except (TypeError, ValueError):
        raise ConfigError(f"tensor split {text!r} is not a list of numbers like 3,1") from None
    if not all(math.isfinite(w) and w >= 0 for w in weights) or not any(weights):
        raise ConfigError(f"tensor split {text!r}: weights must be >= 0, one of them > 0")
    return weights


def offload_devices(endpoints: tuple[str, ...], *, with_local: bool = False):
    """The devices a model's offloaded layers may go to, in order, or ``None`` for llama.cpp's
    default (every device, when this process has registered no worker). On workers: their
    devices, in ``endpoints`` order, then (``with_local``: a tensor split weighs them too) this
    machine's GPUs. Locally, once a worker is registered here: this machine's GPUs (left to
    the default, llama.cpp would use the workers' devices too)."""
    from . import rpc

    local = [d for d in rpc.local_devices() if d.kind != "CPU"] if with_local or rpc.connected() else None
    if endpoints:
        return rpc.connect(endpoints) + (local if with_local else [])
    return local


def _split_array(weights: tuple[float, ...], devices) -> ctypes.Array:
    """``llama_model_params.tensor_split``: a weight per device (llama.cpp reads one for each)."""
    if not devices:
        raise ConfigError("a tensor split shares layers among devices, and there are none: "
                          "no GPU here and no --rpc workers")
    if len(weights) > len(devices):
        names = ", ".join(d.name for d in devices)
        raise ConfigError(f"tensor split {','.join(f'{w:g}' for w in weights)} has {len(weights)} "
                          f"weights for {len(devices)} devices ({names})")
    n = max(len(devices), llama_cpp.llama_max_devices())
    return (ctypes.c_float * n)(*weights)


_BUFFER_LINE = re.compile(r"(\S+) model buffer size =\s*([\d.]+) MiB")


def model_buffers(log_lines: list[str]) -> dict[str, float]:
    """MiB of model weights per buffer, from llama.cpp's load log."""
    out: dict[str, float] = {}
    for line in log_lines:
        if m := _BUFFER_LINE.search(line):
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def check_gguf_file(path: Path) -> None:
    """Raise ModelError with a precise reason if ``path`` cannot be a loadable GGUF file."""
    if not path.exists():
        raise ModelError(f"model file not found: {path}")
    if path.is_dir():
        raise ModelError(f"model path is a directory, not a GGUF file: {path}")
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as err:
        raise ModelError(f"cannot read model file {path}: {err.strerror or err}") from None
    if not magic:
        raise ModelError(f"not a GGUF file (the file is empty): {path}")
    if magic != b"GGUF":
        raise ModelError(f"not a GGUF file (bad magic {magic!r}): {path}")


class LlamaBackend:
    """One llama.cpp model and context, with the KV cache contents tracked in ``tokens``."""

    def __init__(self, options: ModelOptions) -> None:
        self.options = options
        path = Path(options.path)
        width = options.fixed_width
        if not 0 <= width <= min(options.n_batch, MAX_SAMPLED_ROWS):
            raise ConfigError(f"fixed width must be 0 (off) to {min(options.n_batch, MAX_SAMPLED_ROWS)} "
                              f"tokens, got {width}")
        check_gguf_file(path)
        take_log_lines()  # drop stale lines
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = options.n_gpu_layers
        from .rpc import device_array

        devices = offload_devices(options.rpc, with_local=bool(options.tensor_split))
        self._devices = None if devices is None else device_array(devices)  # alive with the model
        if self._devices is not None:
            mparams.devices = ctypes.cast(self._devices, ctypes.c_void_p).value
        if options.tensor_split:
            self._split = _split_array(options.tensor_split, devices or [])
            mparams.tensor_split = ctypes.cast(self._split, ctypes.POINTER(ctypes.c_float))
        mparams.use_extra_bufts = options.repack
        mparams.progress_callback = load_progress
        try:
            with interrupts_deferred():
                self._model = _internals.LlamaModel(path_model=str(path), params=mparams, verbose=True)
        except ValueError:
            raise ModelError(f"cannot load model {path}: {load_failure_reason()}") from None
        except BaseException:  # Ctrl-C: the model may have loaded just before it was noticed
            self.close()
            raise
        #: MiB of weights on each buffer (``CPU_Mapped``, ``RPC0[host:port]``, ``CUDA0``)
        self.placement: dict[str, float] = model_buffers(take_log_lines())

        cparams = llama_cpp.llama_context_default_params()
        # room for a full context's last call and its pads: the pads never cost the user context
        cparams.n_ctx = options.n_ctx + max(width - 1, 0)
        cparams.n_batch = options.n_batch
        cparams.n_ubatch = options.n_batch
        cparams.n_seq_max = 1
        cparams.n_threads = options.n_threads
        cparams.n_threads_batch = options.n_threads
        cparams.no_perf = True
        if options.backend_sampling and hasattr(cparams, "n_outputs_max_per_seq"):
            # a verification batch's rows are all sampled in the graph (default: one per call)
            cparams.n_outputs_max_per_seq = MAX_SAMPLED_ROWS
        if flash_attention_off(options):
            cparams.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        try:
            with interrupts_deferred():
                self._ctx = _internals.LlamaContext(model=self._model, params=cparams, verbose=True)
        except BaseException as err:
            self.close()  # frees what exists, context before model
            if not isinstance(err, ValueError):
                raise
            reason = recent_errors() or "out of memory?"
            raise ModelError(f"failed to create a context of {options.n_ctx} tokens: {reason}") from None
        self._batch = llama_cpp.llama_batch_init(options.n_batch, 0, 1)
        # NumPy views over the batch's C arrays: filling a batch is a few slice assignments.
        # Every token is in sequence 0, set once here.
        nb = options.n_batch
        self._b_token = np.ctypeslib.as_array(self._batch.token, shape=(nb,))
        self._b_pos = np.ctypeslib.as_array(self._batch.pos, shape=(nb,))
        self._b_logits = np.ctypeslib.as_array(self._batch.logits, shape=(nb,))
        np.ctypeslib.as_array(self._batch.n_seq_id, shape=(nb,))[:] = 1
        for j in range(nb):
            self._batch.seq_id[j][0] = 0
        self._positions = np.arange(options.n_ctx + nb + width, dtype=np.int32)
        #: the batch's first rows that are flagged as outputs now (:meth:`_decode_picks`)
        self._outputs_flagged = 0
        self._view: np.ndarray | None = None
        self._view_key: tuple[int, int] | None = None
        self._gather: np.ndarray | None = None
        self._vocab = self._model.vocab
        self.n_vocab: int = llama_cpp.llama_vocab_n_tokens(self._vocab)
        # llama.cpp may pad the context and clamp the batch to it: use what it really has,
        # but never more context than was asked for.
        self.n_ctx: int = min(options.n_ctx,
                              llama_cpp.llama_n_ctx(self._ctx.ctx) - max(width - 1, 0))
        self._n_batch: int = min(llama_cpp.llama_n_batch(self._ctx.ctx),
                                 llama_cpp.llama_n_ubatch(self._ctx.ctx))
        #: token ids held by the KV cache, position i holds tokens[i]
        self.tokens: list[int] = []
        self._pieces_cache: dict[int, bytes] = {}  # token_bytes, once per token id
        self._eog_cache: dict[int, bool] = {}  # is_eog, once per token id
        # The pieces-of-3 rule is about ggml-cpu's kernels. With layers on a GPU, batch scoring
        # is what makes speculation pay, and CUDA picks its kernels by batch size anyway.
        # On RPC workers the pieces stay: a worker serving its CPU runs the same ggml-cpu
        # kernels as here (a GPU worker is batch-dependent anyway: --fast-kernels).
        on_gpu = offloads_locally(options.n_gpu_layers, options.rpc)
        #: width of every logit-reading decode call (0: as many tokens as the call has)
        self.fixed_width: int = width
        self._pieces = options.batch_consistent and not on_gpu and not width
        #: the most tokens one llama_decode call takes where every row's pick is read
        #: (:meth:`_decode_picks`; a fixed width's padded calls take the general path)
        self._picks_per_call: int = (0 if width else CONSISTENT_BATCH[options.repack]
                                     if self._pieces else min(MAX_SAMPLED_ROWS, self._n_batch))
        #: seconds spent inside llama_decode so far (to tell llama.cpp's time from Python's)
        self.decode_seconds = 0.0
        #: llama_decode returns before the device is done (a local GPU, RPC workers): a call
        #: begun with :meth:`start_decode` lets the caller work while the device computes.
        #: On the CPU the decode is the computation, and starting early gains nothing.
        self.asynchronous: bool = on_gpu or bool(options.rpc)
        #: ``decode(..., unread=)`` skips rows' output projection (not at a fixed width)
        self.unread_rows: bool = not width
        self._in_flight = False  #: a launched llama_decode not yet waited for
        #: what :meth:`finish_decode` reads: ``(picks, rows read, rows out)`` of the launched
        #: call (a fixed width's pads are outputs too), or None
        self._launched: tuple[bool, int, int] | None = None
        self._ready = None  #: a result :meth:`start_decode` computed at once
        self.path = path
        # llama.cpp's backend sampling: a one-sampler chain attached to sequence 0 while its
        # rows are decoded (attached, the raw logits are not copied out): greedy's pick, or a
        # draft window's top-k
        self._chain = None  #: the chain attached now, if any
        self._attached: str | int | None = None  #: "argmax", a window's size, or None
        self._retired: list = []  #: chains detached since the last decode (freed after it)
        self.backend_argmax: bool = (options.backend_sampling
                                     and hasattr(llama_cpp, "llama_set_sampler"))
        ngl = options.n_gpu_layers
        #: a draft window (:meth:`decode_window`) is taken in llama.cpp's graph, and the rows
        #: never reach the host: where the output layer is on a local GPU (on the CPU, ggml's
        #: top-k, a partial sort of the whole row, measured no faster than the host's window)
        self.device_window: bool = (self.backend_argmax and on_gpu and (
            ngl < 0 or ngl > llama_cpp.llama_model_n_layer(self._model.model)))
        #: on this machine's GPU, where llama.cpp replays a call's CUDA graph only after two
        #: calls of the same width (:attr:`graph_shapes`)
        self.graph_shapes: bool = on_gpu and not width
        self._watchdog = None
        if options.rpc:
            from .rpc import Watchdog

            self._watchdog = Watchdog(options.rpc, options.rpc_timeout)

    @property
    def kernels(self) -> str:
        """How this model's logits relate to batch shape (:mod:`edgespec.runtime.kernels`):
        ``EXACT_PIECES`` (CPU kernels, pieces of CONSISTENT_BATCH), ``EXACT_FIXED_WIDTH`` (every
        logit-reading call ``fixed_width`` wide) or ``BATCH_DEPENDENT``."""
        if self.fixed_width:
            return EXACT_FIXED_WIDTH
        return EXACT_PIECES if self._pieces else BATCH_DEPENDENT

    # ---- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Free the context and model (idempotent)."""
        if getattr(self, "_in_flight", False) and getattr(self, "_ctx", None) is not None:
            self._settle()  # (nothing is freed under a running decode)
        if getattr(self, "_watchdog", None) is not None:
            self._watchdog.close()
        if getattr(self, "_batch", None) is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None) is not None:
            self._ctx.close()
            self._ctx = None
        for chain in [getattr(self, "_chain", None), *getattr(self, "_retired", [])]:
            if chain is not None:  # (after the context using it)
                llama_cpp.llama_sampler_free(chain)
        self._chain, self._retired = None, []
        if getattr(self, "_model", None) is not None:
            self._model.close()
            self._model = None

    def __del__(self) -> None:
        self.close()

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
            ok = llama_cpp.llama_memory_seq_rm(self._ctx.memory, 0, n, -1)
            if not ok:  # recurrent models cannot drop a suffix: start over
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
        makes (spans, output flags, slices, the result array) cost 10-40 µs, not the ~1 µs it
        costs in a warm loop. A few tokens go in through the batch's C arrays one by one.
        Without ``wait`` the call is only launched (:meth:`start_decode`)."""
        if self._in_flight:
            self._settle()
        start = len(self.tokens)
        if start + n > self.n_ctx:
            raise ContextOverflowError(
                f"{start + n} tokens do not fit in the context of {self.n_ctx}")
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

    def start_decode(self, tokens: Sequence[int], n_logits: int, *, picks: bool = False) -> None:
        """Begin :meth:`decode` (:meth:`decode_argmax` with ``picks``) of ``tokens`` and, where
        llama.cpp's decode is asynchronous (:attr:`asynchronous`) and one llama_decode call
        takes them all, return while the device computes; :meth:`finish_decode` waits and
        gives the result. The record of the cache holds ``tokens`` at once, so a decode whose
        result is never read is cut off by the next ``sync``. Any other call on this backend
        waits for the device first (and a decode in between takes the place of this one's
        result: finish first). Otherwise (the CPU's exact pieces, more tokens than one call
        takes, no backend sampler for picks) the result is computed here, and kept for
        :meth:`finish_decode`. At a fixed width the call is padded as :meth:`decode` pads it,
        and the pads leave the cache's cells at once (llama.cpp's bookkeeping, not the
        device's: the launched graph is not touched)."""
        if self._in_flight:
            self._settle()
        n = len(tokens)
        width = self.fixed_width
        self._launched = self._ready = None
        if picks:
            if n_logits and self.backend_argmax and self._attached != "argmax":
                self._attach("argmax")
            if n_logits == n and self._argmax_on and n <= self._picks_per_call:
                self._decode_picks(tokens, n, wait=False)
                self._launched = (True, n, n)
                return
            launchable = n_logits == n and self._argmax_on and 0 < n <= width
        else:
            launchable = (0 < n_logits <= n and not self._pieces and
                          (0 < n <= width and n_logits == n if width else n <= self._n_batch))
            if launchable and self._attached is not None:
                self._attach(None)
        if not launchable:
            self._ready = self.decode_argmax(tokens, n_logits) if picks else self.decode(tokens, n_logits)
            return
        start = len(self.tokens)
        if start + n > self.n_ctx:
            raise ContextOverflowError(
                f"{start + n} tokens do not fit in the context of {self.n_ctx}")
        calls = self._fill(tokens, start, n - n_logits, bool(width))
        try:
            self._launch()
            if calls > n:
                self._drop_pads(start + n)  # (while the call runs: the cells' bookkeeping only)
            self.tokens += tokens
        except BaseException:
            self.reset()  # (as in _decode_picks)
            raise
        self._launched = (picks, n_logits, calls if width else n_logits)

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
        picks, rows, outputs = launched
        if picks:
            return self._sampled_ids(rows)
        view = self._logits_view(outputs)
        return view if outputs == rows else view[:rows]

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

    def _decode(self, tokens: Sequence[int], n_logits: int, sampled: str | int | None,
                unread: Sequence[int] = ()) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        if not 0 <= n_logits <= len(tokens):
            raise ValueError(f"n_logits={n_logits} for {len(tokens)} tokens")
        if self._in_flight:
            self._settle()
        start = len(self.tokens)
        if start + len(tokens) > self.n_ctx:
            raise ContextOverflowError(
                f"{start + len(tokens)} tokens do not fit in the context of {self.n_ctx}"
            )
        first_logit = len(tokens) - n_logits
        width = self.fixed_width
        spans = self._chunks(len(tokens), first_logit)
        skipped = frozenset(unread) if unread and not width and sampled is None else frozenset()
        window = None
        if sampled is not None:
            if sampled == "argmax":
                out = np.empty(n_logits, np.int32)
            else:
                out = None
                window = (np.empty((n_logits, sampled), np.int32),
                          np.empty((n_logits, sampled), np.float32))
            single = False
            if not self._pieces and not width:
                spans = self._chunks(len(tokens), first_logit, MAX_SAMPLED_ROWS)
        else:
            # one llama_decode call produces every row: hand out llama.cpp's buffer; otherwise
            # (pieces) gather the rows in a buffer of ours
            single = not skipped and sum(c1 > first_logit for _, c1 in spans) == 1
            out = None if single or not n_logits else self._gather_rows(n_logits)
        try:
            for c0, c1 in spans:
                m = c1 - c0
                reads = c1 > first_logit
                skip = max(0, first_logit - c0)  # leading rows of this call whose logits are not read
                padded = reads and width
                lo = max(c0, first_logit) - first_logit
                off = [j for j in range(skip, m) if lo + j - skip in skipped] if reads else []
                n = self._fill(tokens[c0:c1], start + c0, skip if reads else m, bool(padded),
                               off)
                self._call()
                if n > m:
                    self._drop_pads(start + c1)
                self.tokens.extend(tokens[c0:c1])
                if reads and off:  # llama.cpp's outputs: the rows read, in order
                    got = self._logits_view(m - skip - len(off)) if m - skip > len(off) else ()
                    read = [lo + j - skip for j in range(skip, m) if j not in off]
                    for i, row in zip(read, got):
                        out[i] = row
                    continue
                if reads:
                    rows = m - skip
                    first = skip if padded else 0  # output index of the first row read
                    if window is not None:
                        self._sampled_window(window, lo, rows, first)
                        continue
                    if sampled is not None:
                        out[lo:lo + rows] = self._sampled_ids(rows, first)
                        continue
                    got = self._logits_view(n if padded else rows)[first:first + rows]
                    if single:
                        out = got
                    else:
                        out[lo:lo + rows] = got
        except BaseException:
            # Interrupted or failed mid-way: the cache may hold more than `tokens` says.
            # Forget it all; the next sync() re-decodes the prompt. Never silently wrong.
            self.reset()
            raise
        if window is not None:
            return window
        if out is None:
            return np.empty((0, self.n_vocab), np.float32)
        out.flags.writeable = False
        return out

    def _sampled_window(self, out: tuple[np.ndarray, np.ndarray], lo: int, rows: int,
                        first: int) -> None:
        """The backend top-k's ids and logits for ``rows`` outputs of the last call from
        ``first`` on, into rows ``lo``... of ``out``."""
        ctx = self._ctx.ctx
        ids, logits = out
        width = ids.shape[1]
        for j in range(rows):
            n = llama_cpp.llama_get_sampled_candidates_count_ith(ctx, first + j)
            got_ids = llama_cpp.llama_get_sampled_candidates_ith(ctx, first + j)
            got_logits = llama_cpp.llama_get_sampled_logits_ith(ctx, first + j)
            if n != width or not got_ids or not got_logits or (
                    llama_cpp.llama_get_sampled_logits_count_ith(ctx, first + j) != width):
                raise ModelError(f"llama.cpp's backend top-k returned {n} of {width} candidates")
            ids[lo + j] = np.ctypeslib.as_array(got_ids, shape=(width,))
            logits[lo + j] = np.ctypeslib.as_array(got_logits, shape=(width,))

    def _fill(self, tokens: Sequence[int], pos: int, read_from: int, pad: bool,
              off: Sequence[int] = ()) -> int:
        """Fill the batch for one llama_decode: ``tokens`` at positions from ``pos``, the rows
        from ``read_from`` on flagged as outputs but those in ``off``; with ``pad``, copies of
        the last token at the next positions up to the fixed width, every row an output.
        Return the call's width."""
        m = len(tokens)
        flags = self._b_logits
        self._b_token[:m] = tokens
        self._outputs_flagged = 0
        n = m
        if pad:
            n = self.fixed_width
            self._b_token[m:n] = self._b_token[m - 1]
            flags[:n] = 1
        else:
            flags[:read_from] = 0
            flags[read_from:m] = 1
            for j in off:
                flags[j] = 0
        self._b_pos[:n] = self._positions[pos:pos + n]
        self._batch.n_tokens = n
        return n

    def _drop_pads(self, end: int) -> None:
        """Take a padded call's pads (the positions from ``end`` on) out of the cache."""
        if not llama_cpp.llama_memory_seq_rm(self._ctx.memory, 0, end, -1):
            raise ModelError("this model's cache cannot drop tokens (a recurrent model?): "
                             "it cannot run at a fixed width")

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

    def _sampled_ids(self, n: int, first: int = 0) -> list[int]:
        """The backend sampler's picks for ``n`` outputs of the last call from ``first`` on."""
        get, ctx = llama_cpp.llama_get_sampled_token_ith, self._ctx.ctx
        picks = [get(ctx, first + j) for j in range(n)]
        if min(picks) < 0:  # LLAMA_TOKEN_NULL: nothing was sampled
            raise ModelError("llama.cpp's backend sampler returned no token")
        return picks

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

    def _chunks(self, n: int, first_logit: int, rows: int | None = None) -> list[tuple[int, int]]:
        """Split a decode into llama_decode calls: tokens without logits (prefill) in batches of
        n_batch; tokens whose logits are read, in batch-consistent mode, in batches small enough
        that every one of them goes through the same matmul kernels as a single token, or at a
        fixed width, of that width (or, if given, of at most ``rows``)."""
        step = self._n_batch
        spans = [(c, min(c + step, first_logit)) for c in range(0, first_logit, step)]
        if self.fixed_width:
            step = self.fixed_width
        elif self._pieces:
            step = min(CONSISTENT_BATCH[self.options.repack], step)
        elif rows is not None:
            step = min(rows, step)
        spans += [(c, min(c + step, n)) for c in range(first_logit, n, step)]
        return spans

    # ---- vocabulary ------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Text to token ids; ``add_special`` adds BOS where the model wants one."""
        add_bos = add_special and bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))
        return self._model.tokenize(text.encode("utf-8"), add_bos, parse_special)

    def token_bytes(self, token: int) -> bytes:
        """The raw bytes of one token (may be part of a multi-byte character)."""
        piece = self._pieces_cache.get(token)
        if piece is None:
            buf = ctypes.create_string_buffer(64)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
            piece = self._pieces_cache[token] = buf.raw[:n]
        return piece

    def token_text(self, token: int) -> str:
        """The vocabulary entry's text (as stored in the GGUF), for compatibility checks."""
        return (llama_cpp.llama_vocab_get_text(self._vocab, token) or b"").decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        """End of generation (EOS, EOT, ...)."""
        eog = self._eog_cache.get(token)
        if eog is None:  # asked of every emitted token: llama.cpp is asked once per id
            eog = self._eog_cache[token] = bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))
        return eog

    @functools.cached_property
    def constraint_tokenizer(self):
        """The vocabulary as llguidance's tokenizer (:mod:`edgespec.runtime.constraint`), made
        on first use (~1 s for 152k tokens) and kept; every end-of-generation token ends a
        constrained text."""
        from llguidance import LLTokenizer

        # (llguidance.llamacpp.lltokenizer_from_vocab, less a deprecated call per token)
        vocab = self._vocab
        control = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL
        user = llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
        buf = ctypes.create_string_buffer(16 * 1024 + 1)
        pieces, eog = [], []
        for token in range(self.n_vocab):
            n = llama_cpp.llama_token_to_piece(vocab, token, buf, 16 * 1024, 0, True)
            piece = bytes(buf[:max(n, 0)])
            attr = llama_cpp.llama_vocab_get_attr(vocab, token)
            # control tokens (and user-defined ones that look like them) are special to
            # llguidance: marked with a leading 0xff
            if attr & control or (attr & user and piece.startswith(b"<") and piece.endswith(b">")):
                piece = b"\xff" + piece
            pieces.append(piece)
            if llama_cpp.llama_vocab_is_eog(vocab, token):
                eog.append(token)
        tokenize = ctypes.cast(llama_cpp.llama_cpp._lib.llama_tokenize, ctypes.c_void_p).value
        return LLTokenizer.from_llamacpp(tokens=pieces, vocab_ptr=vocab, tokenize_fptr=tokenize,
                                         eos_token=eog or self.eos, slices=None)

    @property
    def vocab_type(self) -> int:
        return int(llama_cpp.llama_vocab_type(self._vocab))

    @property
    def bos(self) -> int:
        return int(llama_cpp.llama_vocab_bos(self._vocab))

    @property
    def eos(self) -> int:
        return int(llama_cpp.llama_vocab_eos(self._vocab))

    def metadata(self) -> dict[str, str]:
        """GGUF key/value metadata (string values)."""
        return self._model.metadata()

    def chat_prompt(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """Render chat messages with the model's own template (GGUF ``tokenizer.chat_template``),
        which is given ``tools`` (OpenAI function tools) where there are some."""
        if tools:
            return self._chat_formatter(messages=messages, tools=tools).prompt
        return self._chat_formatter(messages=messages).prompt

    @functools.cached_property
    def _chat_formatter(self):
        # Compiled once per model: compiling the default target's template costs ~10 ms, more
        # than a short prompt's whole prefill on a GPU.
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        template = self.metadata().get("tokenizer.chat_template")
        if not template:
            raise ModelError(f"{self.path.name} has no chat template: use raw mode (--raw)")
        return Jinja2ChatFormatter(
            template=template,
            eos_token=self.token_text(self.eos) if self.eos >= 0 else "",
            bos_token=self.token_text(self.bos) if self.bos >= 0 else "",
        )



def check_compatible(target: LlamaBackend, draft: LlamaBackend) -> None:
    """Refuse a draft whose tokens do not mean the same as the target's.

    Same vocabulary type, same BOS/EOS, vocab sizes within 128 (padding rows), and identical
    token texts over the shared range. Raises IncompatibleDraftError saying what differs.
    """
    name = f"draft {draft.path.name} cannot draft for target {target.path.name}"
    if target.vocab_type != draft.vocab_type:
        raise IncompatibleDraftError(f"{name}: tokenizer types differ")
    diff = abs(target.n_vocab - draft.n_vocab)
    if diff > _MAX_VOCAB_SIZE_DIFFERENCE:
        raise IncompatibleDraftError(
            f"{name}: vocabulary sizes differ ({target.n_vocab} vs {draft.n_vocab})"
        )
    if (target.bos, target.eos) != (draft.bos, draft.eos):
        raise IncompatibleDraftError(
            f"{name}: special tokens differ (BOS/EOS {target.bos}/{target.eos} "
            f"vs {draft.bos}/{draft.eos})"
        )
    for tok in range(min(target.n_vocab, draft.n_vocab)):
        if target.token_text(tok) != draft.token_text(tok):
            raise IncompatibleDraftError(
                f"{name}: token {tok} is {target.token_text(tok)!r} in the target "
                f"but {draft.token_text(tok)!r} in the draft"
            )
