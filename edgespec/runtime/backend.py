"""The backend the rest of edgespec uses: one GGUF model and one llama.cpp context on it.

:class:`LlamaBackend` is the composition of a :class:`~edgespec.runtime.llama_model.LlamaModel`
(the loaded file: vocabulary, chat template, where the layers went) and a
:class:`~edgespec.runtime.llama_context.LlamaContext` (a KV cache with an exact record of what it
holds, ``tokens``, and the decode calls, split by the pure plan of
:mod:`edgespec.runtime.callplan`), made from one :class:`ModelOptions`. This module checks the
options and the file before anything loads, decides how decode calls are shaped for exactness,
and says what the llama.cpp build and this machine offer (:func:`system_info`,
:func:`consistent_build`, :func:`offloads_locally`). This module, the model's and the
context's (with ``llama_log``, llama.cpp's log, and ``rpc``, its workers) are the ones that call
into llama-cpp-python.

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

import math
import operator
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..core.lookup import common_prefix
from ..config import RECURRENT_SNAPSHOTS
from ..errors import ConfigError, IncompatibleDraftError, ModelError
from .kernels import flash_attention_off
from .llama_context import MAX_SAMPLED_ROWS, ContextParams, LlamaContext
from .llama_log import interrupts_deferred, set_verbose  # noqa: F401  (re-exported)
from .llama_model import LlamaModel, model_buffers, offload_devices  # noqa: F401  (re-exported)
from .rpc import DEFAULT_RPC_TIMEOUT_S

import llama_cpp  # noqa: E402  (after our own imports: llama_cpp prints on import errors)

#: llama.cpp compares this many token texts, skipping the first few special ids; so do we,
#: but over the whole shared vocabulary.
_MAX_VOCAB_SIZE_DIFFERENCE = 128

#: Largest decode batch whose logits use the same kernels as a single token (llamafile and
#: flash attention off): with repacked weights, ggml-cpu's repacked GEMV runs up to 3 rows and a
#: GEMM from 4; without repacking, the generic path runs up to 7 rows and a tiled K-quant
#: matmul from 8.
CONSISTENT_BATCH = {True: 3, False: 7}


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
    #: load the GGUF's multi-token-prediction layers where it has some (a target: the ``mtp``
    #: source drafts with them, :mod:`edgespec.runtime.mtp`)
    mtp: bool = False


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


def _check_width(options: ModelOptions) -> None:
    """:class:`ConfigError` unless the fixed width is 0 (off) or fits one call and its sampler."""
    most = min(options.n_batch, MAX_SAMPLED_ROWS)
    if not 0 <= options.fixed_width <= most:
        raise ConfigError(f"fixed width must be 0 (off) to {most} tokens, "
                          f"got {options.fixed_width}")


def _mtp_layers(path: Path) -> int:
    """The GGUF's multi-token-prediction layers (0 where its header cannot say: llama.cpp's
    load then tells what is wrong with the file)."""
    from ..models.gguf_meta import GGUFError
    from .mtp import nextn_layers

    try:
        return nextn_layers(path)
    except (GGUFError, OSError, ValueError):
        return 0


def _context_params(options: ModelOptions, model: LlamaModel, on_gpu: bool) -> ContextParams:
    """The context ``options`` ask for on ``model``, whose layers are on this machine's GPU
    where ``on_gpu``."""
    # The pieces-of-3 rule is about ggml-cpu's kernels. With layers on a GPU, batch scoring
    # is what makes speculation pay, and CUDA picks its kernels by batch size anyway.
    # On RPC workers the pieces stay: a worker serving its CPU runs the same ggml-cpu
    # kernels as here (a GPU worker is batch-dependent anyway: --fast-kernels).
    pieces = options.batch_consistent and not on_gpu and not options.fixed_width
    piece = CONSISTENT_BATCH[options.repack] if pieces else 0
    if model.recurrent and options.fixed_width:
        raise ConfigError("a fixed width is not supported on a model with recurrent layers "
                          "(its pads could not leave the cache): drop --fixed-width/--exact")
    return ContextParams(
        n_ctx=options.n_ctx, n_batch=options.n_batch, n_threads=options.n_threads,
        fixed_width=options.fixed_width, piece=piece,
        snapshots=(piece - 1 if piece else RECURRENT_SNAPSHOTS) if model.recurrent else 0,
        flash_attention=not flash_attention_off(options), backend_sampling=options.backend_sampling,
        output_on_gpu=on_gpu and model.output_offloaded,
        rpc=options.rpc, rpc_timeout=options.rpc_timeout)


def _forward(path: str, doc: str = "", *, settable: bool = False) -> property:
    """A property that reads ``self.<path>`` (``"context.tokens"``), and with ``settable``
    writes it there too."""
    owner, _, name = path.partition(".")

    def write(self, value) -> None:
        setattr(getattr(self, owner), name, value)

    return property(operator.attrgetter(path), write if settable else None, doc=doc)


class LlamaBackend:
    """One llama.cpp model and one context on it, with the KV cache contents tracked in
    ``tokens``: what the engine, the drafters, the loop and the benches use. Its vocabulary and
    chat template are the model's (:attr:`model`), its cache and decode calls the context's
    (:attr:`context`); the names here forward to whichever owns them."""

    model: LlamaModel | None = None
    context: LlamaContext | None = None

    def __init__(self, options: ModelOptions) -> None:
        self.options = options
        path = Path(options.path)
        _check_width(options)
        check_gguf_file(path)
        self.model = LlamaModel(path, n_gpu_layers=options.n_gpu_layers, repack=options.repack,
                                endpoints=options.rpc, tensor_split=options.tensor_split,
                                load_mtp=options.mtp and _mtp_layers(path) > 0)
        try:
            on_gpu = offloads_locally(options.n_gpu_layers, options.rpc)
            self.context = LlamaContext(self.model, _context_params(options, self.model, on_gpu))
        except BaseException:
            self.close()  # frees what exists, context before model
            raise
        #: llama_decode returns before the device is done (a local GPU, RPC workers): a call
        #: begun with :meth:`start_decode` lets the caller work while the device computes.
        #: On the CPU the decode is the computation, and starting early gains nothing.
        self.asynchronous: bool = on_gpu or bool(options.rpc)
        #: on this machine's GPU, where llama.cpp replays a call's CUDA graph only after two
        #: calls of the same width
        self.graph_shapes: bool = on_gpu and not options.fixed_width

    path = _forward("model.path", "The GGUF file.")
    n_vocab = _forward("model.n_vocab", "Rows of the vocabulary (of each row of logits).")
    placement = _forward("model.placement", "MiB of weights on each buffer (``CUDA0``, ...).")
    tokens = _forward("context.tokens", "Token ids the KV cache holds (position i: tokens[i]).")
    n_ctx = _forward("context.n_ctx", "Tokens the KV cache may hold.", settable=True)
    decode_seconds = _forward("context.decode_seconds", "Seconds spent inside llama_decode so far.")
    fixed_width = _forward("context.fixed_width", "Width of every logit-reading call (0: off).")
    unread_rows = _forward("context.unread_rows", "``decode(..., unread=)`` skips rows' outputs.")
    backend_argmax = _forward("context.backend_argmax", "Greedy picks come from llama.cpp's graph.")
    device_window = _forward("context.device_window", "Draft windows are taken on the GPU.",
                             settable=True)
    kernels = _forward("context.kernels", "How logits relate to batch shape "
                       "(:mod:`edgespec.runtime.kernels`).")
    draft_reach = _forward("context.draft_reach", "The longest draft a round may score (None: "
                           "any; a model with recurrent layers rolls back one call).")
    recurrent = _forward("model.recurrent", "Some layers keep a recurrent state (a hybrid model).")
    load_mtp = _forward("model.load_mtp", "The model's MTP layers are loaded (an MTP head may run).")

    def close(self) -> None:
        """Free the context and model (idempotent)."""
        if self.context is not None:
            self.context.close()
        if self.model is not None:
            self.model.close()

    def __del__(self) -> None:
        self.close()

    # ---- the context: KV cache and decoding (see LlamaContext) ---------------------------------

    def sync(self, prefix: Sequence[int]) -> int:
        """Trim the KV cache to its longest common prefix with ``prefix``; return its length
        (through :meth:`trim`, so that a wrapped ``trim`` sees every cut)."""
        return self.trim(common_prefix(self.tokens, prefix))

    def trim(self, n: int) -> int:
        """:meth:`LlamaContext.trim`: keep the first ``n`` cached tokens."""
        return self.context.trim(n)

    def reset(self) -> None:
        """Empty the KV cache."""
        self.context.reset()

    def decode(self, tokens: Sequence[int], n_logits: int,
               unread: Sequence[int] = ()) -> np.ndarray:
        """:meth:`LlamaContext.decode`: append ``tokens``, the last ``n_logits`` rows of logits."""
        return self.context.decode(tokens, n_logits, unread)

    def decode_argmax(self, tokens: Sequence[int], n_logits: int) -> list[int]:
        """:meth:`LlamaContext.decode_argmax`: each row's greedy pick."""
        return self.context.decode_argmax(tokens, n_logits)

    def decode_window(self, tokens: Sequence[int], n_logits: int,
                      window: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`LlamaContext.decode_window`: each row's ``window`` largest logits."""
        return self.context.decode_window(tokens, n_logits, window)

    def start_decode(self, tokens: Sequence[int], n_logits: int, *, picks: bool = False) -> None:
        """:meth:`LlamaContext.start_decode`: begin a decode, on the device while the caller
        works where llama.cpp's decode is :attr:`asynchronous`."""
        self.context.start_decode(tokens, n_logits, picks=picks)

    def finish_decode(self) -> list[int] | np.ndarray:
        """:meth:`LlamaContext.finish_decode`: the started decode's result."""
        return self.context.finish_decode()

    # ---- the model: vocabulary and chat template (see LlamaModel) -----------------------------

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Text to token ids; ``add_special`` adds BOS where the model wants one."""
        return self.model.tokenize(text, add_special=add_special, parse_special=parse_special)

    def token_bytes(self, token: int) -> bytes:
        """The raw bytes of one token (may be part of a multi-byte character)."""
        return self.model.token_bytes(token)

    def token_text(self, token: int) -> str:
        """The vocabulary entry's text (as stored in the GGUF), for compatibility checks."""
        return self.model.token_text(token)

    def is_eog(self, token: int) -> bool:
        """End of generation (EOS, EOT, ...)."""
        return self.model.is_eog(token)

    constraint_tokenizer = _forward("model.constraint_tokenizer",
                                    "The vocabulary as llguidance's tokenizer (made once).")
    has_chat_template = _forward("model.has_chat_template", "The GGUF has a chat template.")
    vocab_type = _forward("model.vocab_type")
    bos = _forward("model.bos")
    eos = _forward("model.eos")

    def metadata(self) -> dict[str, str]:
        """GGUF key/value metadata (string values)."""
        return self.model.metadata()

    def chat_prompt(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """Render chat messages with the model's own template (given ``tools`` if any)."""
        return self.model.chat_prompt(messages, tools)

    # ---- the context's and model's own names, as tests and scripts reach them -----------------

    _model = _forward("model.handle")
    _ctx = _forward("context._ctx")
    _batch = _forward("context._batch")
    _in_flight = _forward("context._in_flight")
    _launched = _forward("context._launched")
    _ready = _forward("context._ready")
    _argmax_on = _forward("context._argmax_on")
    _picks_per_call = _forward("context._picks_per_call")
    _attached = _forward("context._attached", settable=True)
    _chain = _forward("context._chain", settable=True)
    _attach = _forward("context._attach")
    _decode = _forward("context._decode")
    _decode_picks = _forward("context._decode_picks", settable=True)

    def _chunks(self, n: int, first_logit: int) -> list[tuple[int, int]]:
        """The ``(start, stop)`` of each llama_decode call of a decode of ``n`` tokens whose
        rows are read from ``first_logit`` on."""
        return [(call.start, call.stop) for call in self.context.plan(n, n - first_logit)]


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

