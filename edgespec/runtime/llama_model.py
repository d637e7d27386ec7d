"""One loaded GGUF model: its weights, vocabulary and chat template, without a context.

:class:`LlamaModel` loads the file's weights onto the devices its options name (this machine's,
RPC workers', shared by a tensor split) and answers what needs the model alone: the vocabulary
(tokenizing, a token's bytes and text, which tokens end a generation, llguidance's tokenizer for
constraints), the GGUF metadata and the chat template it holds, and facts about where its layers
went (``placement``, whether the output layer is offloaded). It holds no KV cache and decodes
nothing: contexts (:class:`edgespec.runtime.llama_context.LlamaContext`) do, any number on one
model, and are freed before it.
"""

from __future__ import annotations

import ctypes
import functools
import re
from pathlib import Path

from ..errors import ConfigError, ModelError
from . import rpc
from .llama_log import interrupts_deferred, load_failure_reason, load_progress, take_log_lines

import llama_cpp  # noqa: E402  (after our own imports: llama_cpp prints on import errors)
from llama_cpp import _internals  # noqa: E402


def offload_devices(endpoints: tuple[str, ...], *, with_local: bool = False):
    """The devices a model's offloaded layers may go to, in order, or ``None`` for llama.cpp's
    default (every device, when this process has registered no worker). On workers: their
    devices, in ``endpoints`` order, then (``with_local``: a tensor split weighs them too) this
    machine's GPUs. Locally, once a worker is registered here: this machine's GPUs (left to
    the default, llama.cpp would use the workers' devices too)."""
    local = [d for d in rpc.local_devices() if d.kind != "CPU"] if with_local or rpc.connected() else None
    if endpoints:
        return rpc.connect(endpoints) + (local if with_local else [])
    return local


def model_params(endpoints: tuple[str, ...] = (), *, with_local: bool = False):
    """llama.cpp's default model parameters with the devices :func:`offload_devices` gives
    (this machine's only, without ``endpoints``), those devices, and the array the
    parameters point to (keep it alive while loading): left to llama.cpp, a load would take
    every registered device, an RPC worker this process connected to (and lost) included."""
    params = llama_cpp.llama_model_default_params()
    devices = offload_devices(endpoints, with_local=with_local)
    keep = None if devices is None else rpc.device_array(devices)
    if keep is not None:
        params.devices = ctypes.cast(keep, ctypes.c_void_p).value
    return params, devices, keep


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


class LlamaModel:
    """A GGUF file's model, loaded (check the file first: ``backend.check_gguf_file``)."""

    #: llama-cpp-python's model, ``None`` once freed (and if loading failed)
    handle: _internals.LlamaModel | None = None

    def __init__(self, path: Path, *, n_gpu_layers: int = 0, repack: bool = True,
                 endpoints: tuple[str, ...] = (), tensor_split: tuple[float, ...] = (),
                 load_mtp: bool = False) -> None:
        """Load ``path`` with ``n_gpu_layers`` offloaded (-1: all) to the devices of the RPC
        workers at ``endpoints`` or this machine's, shared as ``tensor_split`` weighs them;
        ``repack``: llama.cpp's repacked CPU weights; ``load_mtp``: its multi-token-prediction
        layers too (only where it has some: an MTP context needs them)."""
        self.path = path
        self.n_gpu_layers = n_gpu_layers
        self.load_mtp = load_mtp
        take_log_lines()  # drop stale lines
        params = self._params(n_gpu_layers, repack, endpoints, tensor_split)
        params.load_mtp = load_mtp
        self.handle = self._load(params)
        #: MiB of weights on each buffer (``CPU_Mapped``, ``RPC0[host:port]``, ``CUDA0``)
        self.placement: dict[str, float] = model_buffers(take_log_lines())
        self._vocab = self.handle.vocab
        self._pieces_cache: dict[int, bytes] = {}  # token_bytes, once per token id
        self._eog_cache: dict[int, bool] = {}  # is_eog, once per token id

    def _params(self, n_gpu_layers: int, repack: bool, endpoints: tuple[str, ...],
                tensor_split: tuple[float, ...]):
        """llama.cpp's model parameters; the device and split arrays they point to are kept
        alive with the model."""
        params, devices, self._devices = model_params(endpoints, with_local=bool(tensor_split))
        params.n_gpu_layers = n_gpu_layers
        if tensor_split:
            self._split = _split_array(tensor_split, devices or [])
            params.tensor_split = ctypes.cast(self._split, ctypes.POINTER(ctypes.c_float))
        params.use_extra_bufts = repack
        params.progress_callback = load_progress
        return params

    def _load(self, params) -> _internals.LlamaModel:
        """The model loaded, Ctrl-C stopping the load (and freeing a model it came too late
        for); :class:`ModelError` with llama.cpp's reason where it fails."""
        model = None
        try:
            with interrupts_deferred():
                model = _internals.LlamaModel(path_model=str(self.path), params=params,
                                              verbose=True)
        except ValueError:
            raise ModelError(f"cannot load model {self.path}: {load_failure_reason()}") from None
        except BaseException:  # Ctrl-C: the model may have loaded just before it was noticed
            if model is not None:
                model.close()
            raise
        return model

    @functools.cached_property
    def n_vocab(self) -> int:
        """Tokens in the vocabulary (rows of each row of logits)."""
        return llama_cpp.llama_vocab_n_tokens(self._vocab)

    @functools.cached_property
    def recurrent(self) -> bool:
        """Whether some layers keep a recurrent state instead of a KV cache (a hybrid model
        such as Qwen3.5 or LFM2, or a pure recurrent one): its cache cannot simply drop a
        suffix (:mod:`edgespec.runtime.recurrent`)."""
        model = self.handle.model
        return bool(llama_cpp.llama_model_is_recurrent(model) or llama_cpp.llama_model_is_hybrid(model))

    @property
    def output_offloaded(self) -> bool:
        """Whether the output layer is among the offloaded ones (llama.cpp offloads it last:
        with more layers than the model's repeating ones, or all)."""
        ngl = self.n_gpu_layers
        return ngl < 0 or ngl > llama_cpp.llama_model_n_layer(self.handle.model)

    def close(self) -> None:
        """Free the model (idempotent; its contexts first)."""
        if self.handle is not None:
            self.handle.close()
            self.handle = None

    # ---- vocabulary ------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Text to token ids; ``add_special`` adds BOS where the model wants one."""
        add_bos = add_special and bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))
        return self.handle.tokenize(text.encode("utf-8"), add_bos, parse_special)

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
        """The vocabulary as llguidance's tokenizer (:func:`llguidance_tokenizer`), made on
        first use (~1 s for 152k tokens) and kept."""
        return llguidance_tokenizer(self._vocab, self.n_vocab)

    @property
    def vocab_type(self) -> int:
        return int(llama_cpp.llama_vocab_type(self._vocab))

    @property
    def bos(self) -> int:
        return int(llama_cpp.llama_vocab_bos(self._vocab))

    @property
    def eos(self) -> int:
        return int(llama_cpp.llama_vocab_eos(self._vocab))

    # ---- GGUF metadata and chat template ---------------------------------------------------

    def metadata(self) -> dict[str, str]:
        """GGUF key/value metadata (string values)."""
        return self.handle.metadata()

    @functools.cached_property
    def has_chat_template(self) -> bool:
        """Whether the GGUF carries a chat template (a base model may not)."""
        return bool(self.metadata().get("tokenizer.chat_template"))

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
            raise ModelError(f"{self.path.name} has no chat template: it cannot take a "
                             "conversation, only a raw prompt (--raw)")
        return Jinja2ChatFormatter(
            template=template,
            eos_token=self.token_text(self.eos) if self.eos >= 0 else "",
            bos_token=self.token_text(self.bos) if self.bos >= 0 else "",
        )


def llguidance_tokenizer(vocab, n_vocab: int):
    """A llama.cpp vocabulary as llguidance's tokenizer (:mod:`edgespec.runtime.constraint`):
    every end-of-generation token ends a constrained text. The one way edgespec builds it (the
    engine's models, and ``bench --overhead --structured``'s vocabulary alone)."""
    from llguidance import LLTokenizer

    # (llguidance.llamacpp.lltokenizer_from_vocab, less a deprecated call per token)
    control = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL
    user = llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
    buf = ctypes.create_string_buffer(16 * 1024 + 1)
    pieces, eog = [], []
    for token in range(n_vocab):
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
                                     eos_token=eog or int(llama_cpp.llama_vocab_eos(vocab)),
                                     slices=None)
