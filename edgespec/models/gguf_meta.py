"""Reading a GGUF file's key/value header without the model.

Whether a draft model can draft for a target depends on their tokenizers, which a GGUF file
keeps in its header (``tokenizer.ggml.*``). This reads only that header, sequentially through
one buffer, from any object with ``.read(n)`` (a local file, or a remote one fetched by byte
ranges), so a draft can be judged without downloading or loading it: llama.cpp needs the whole
file, and gguf-py's reader a memory-mapped local one. The same header says what the model is
(:func:`arch_of`): its architecture, whether that keeps recurrent state (hybrid models such as
Qwen3.5's), and how many multi-token-prediction layers it carries.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import struct
from collections.abc import Container, Sequence
from dataclasses import dataclass
from typing import BinaryIO

#: bytes asked of the file per read: the reader runs at most this far past the key/value section
_CHUNK = 1 << 20
#: longer strings and arrays are corrupt lengths, not data worth fetching
_MAX_STRING, _MAX_COUNT = 1 << 24, 1 << 31
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
_STRING, _ARRAY = 8, 9
#: GGUF value type -> struct format of the scalar types (8 is string, 9 array)
_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}
_SCALARS = {t: struct.Struct("<" + c) for t, c in _FORMATS.items()}


class GGUFError(ValueError):
    """Not a GGUF file, or a truncated or malformed header: the message says which."""


class _Reader:
    """Little-endian values read in order from ``fh``, which is never seeked."""

    def __init__(self, fh: BinaryIO) -> None:
        self._fh, self._buf, self._at, self._base = fh, b"", 0, 0

    @property
    def pos(self) -> int:
        """The offset in the file of the next unread byte."""
        return self._base + self._at

    def need(self, n: int) -> None:
        """Buffer at least ``n`` unread bytes (all there are, then raise, if the file ends)."""
        have = len(self._buf) - self._at
        if have >= n:
            return
        parts, self._base = [self._buf[self._at:]], self._base + self._at
        while have < n and (chunk := self._fh.read(max(_CHUNK, n - have))):
            parts.append(chunk)
            have += len(chunk)
        self._buf, self._at = b"".join(parts), 0
        if have < n:
            raise GGUFError("truncated GGUF header")

    def _refill(self, at: int, n: int) -> tuple[bytes, int, int]:
        self._at = at
        self.need(n)
        return self._buf, self._at, len(self._buf)

    def take(self, fmt: struct.Struct) -> tuple:
        self.need(fmt.size)
        self._at += fmt.size
        return fmt.unpack_from(self._buf, self._at - fmt.size)

    def strings(self, count: int, keep: bool = True) -> list[bytes]:
        """``count`` strings' bytes; with ``keep`` false, passed over and [] returned."""
        # The hot loop (Qwen's header holds ~300k strings): locals only, refilled at the edge.
        out: list[bytes] = []
        append, unpack = out.append, _U64.unpack_from
        buf, at, end = self._buf, self._at, len(self._buf)
        for _ in range(count):
            if at + 8 > end:
                buf, at, end = self._refill(at, 8)
            n = unpack(buf, at)[0]
            at += 8
            if at + n > end:
                if n > _MAX_STRING:
                    raise GGUFError(f"malformed GGUF header: a string of {n} bytes")
                buf, at, end = self._refill(at, n)
            if keep:
                append(buf[at:at + n])
            at += n
        self._at = at
        return out

    def value(self, vtype: int, keep: bool = True, raw: bool = False) -> object:
        """One value of GGUF type ``vtype`` (None when not ``keep``: parsed past, not built);
        with ``raw``, a string array comes as the strings' bytes."""
        if vtype in _SCALARS:
            (out,) = self.take(_SCALARS[vtype])
            return out if keep else None
        if vtype == _STRING:
            out = self.strings(1, keep)
            return _text(out[0]) if keep else None
        if vtype != _ARRAY:
            raise GGUFError(f"malformed GGUF header: unknown value type {vtype}")
        (etype,), (count,) = self.take(_U32), self.take(_U64)
        if count > _MAX_COUNT:
            raise GGUFError(f"malformed GGUF header: an array of {count} values")
        if etype == _STRING:
            strings = self.strings(count, keep)
            return None if not keep else strings if raw else _texts(strings)
        if etype not in _SCALARS:  # nor may arrays nest: llama.cpp refuses them too
            raise GGUFError(f"malformed GGUF header: unknown array element type {etype}")
        size = _SCALARS[etype].size * count
        self.need(size)
        fmt = f"<{count}{_FORMATS[etype]}"
        values = struct.unpack_from(fmt, self._buf, self._at) if keep else ()
        self._at += size
        return list(values) if keep else None


def _text(raw: bytes) -> str:
    # surrogateescape: a string that is not UTF-8 (a byte token, say) keeps its exact bytes
    return raw.decode("utf-8", "surrogateescape")


def _texts(raws: list[bytes]) -> list[str]:
    joined = b"\xff".join(raws)
    # One decode, split at the 0xFF separators (a byte UTF-8 never holds, nor can it continue a
    # sequence), is twice as quick as a decode per string, unless a string holds 0xFF itself.
    if joined.count(b"\xff") == len(raws) - 1:
        return _text(joined).split("\udcff")
    return [_text(r) for r in raws]


def _header(r: _Reader) -> tuple[int, int]:
    """Check the magic and version; return (n_tensors, n_kv)."""
    try:
        r.need(4)
    except GGUFError:
        pass  # too short even for the magic: said below
    if r._buf[:4] != b"GGUF":
        raise GGUFError(f"not a GGUF file (starts with {r._buf[:8]!r})")
    (version,) = r.take(struct.Struct("<4xI"))
    if not 2 <= version <= 3:
        raise GGUFError(f"unsupported GGUF version {version} (2 and 3 are read)")
    (n_tensors,), (n_kv,) = r.take(_U64), r.take(_U64)
    if n_kv > _MAX_COUNT:
        raise GGUFError(f"malformed GGUF header: {n_kv} keys")
    return n_tensors, n_kv


def read_metadata(fh: BinaryIO, *, keys: Container[str] | None = None) -> dict[str, object]:
    """The key/value section of the GGUF file read from ``fh``, as ``{key: value}``.

    Scalars come back as int, float, bool or str, arrays as lists. With ``keys``, only those
    keys are returned; the others are still parsed past, their strings skipped undecoded.
    Reads on from where ``fh`` is, never seeks, and stops within one buffered read
    (``_CHUNK``) past the key/value section: tensor data is not fetched. Raises GGUFError.
    """
    return _metadata(fh, keys, raw=False)


def _metadata(fh: BinaryIO, keys: Container[str] | None, raw: bool) -> dict[str, object]:
    r = _Reader(fh)
    _, n_kv = _header(r)
    out: dict[str, object] = {}
    for _ in range(n_kv):
        key = _text(r.strings(1)[0])
        (vtype,) = r.take(_U32)
        keep = keys is None or key in keys
        value = r.value(vtype, keep, raw)
        if keep:
            out[key] = value
    return out


@dataclass(frozen=True)
class TokenizerInfo:
    """What decides whether two GGUF models' tokens mean the same (see :func:`compatible`).

    A prefix's digest is not stored: it is ``tokens_digest(tokens, n)`` of the token list.
    """

    model: str  #: tokenizer.ggml.model, e.g. "gpt2", "llama"
    pre: str  #: tokenizer.ggml.pre, or ""
    bos: int  #: tokenizer.ggml.bos_token_id, or -1
    eos: int  #: tokenizer.ggml.eos_token_id, or -1
    n_tokens: int  #: len(tokenizer.ggml.tokens)
    tokens_sha256: str  #: tokens_digest of all the token texts


def tokens_digest(tokens: Sequence[str], n: int | None = None) -> str:
    """sha256 (hex) over the first ``n`` token texts (all if None): each as its UTF-8 length
    (u32 little-endian) then its bytes, so a prefix's digest is comparable with a whole vocab's."""
    if n is not None and not 0 <= n <= len(tokens):
        raise ValueError(f"cannot digest {n} of {len(tokens)} tokens")
    return _digest([t.encode("utf-8", "surrogateescape") for t in itertools.islice(tokens, n)])


def _digest(raw: list[bytes]) -> str:
    parts: list[bytes] = [b""] * (2 * len(raw))
    parts[0::2] = map(_U32.pack, map(len, raw))
    parts[1::2] = raw
    return hashlib.sha256(b"".join(parts)).hexdigest()


_TOKENIZER = "tokenizer.ggml."
_TOKENIZER_KEYS = frozenset(
    _TOKENIZER + k for k in ("model", "pre", "bos_token_id", "eos_token_id", "tokens"))


def read_tokenizer(fh: BinaryIO) -> tuple[TokenizerInfo, list[str]]:
    """The tokenizer's summary and token texts, from the GGUF header read from ``fh``."""
    meta = _metadata(fh, _TOKENIZER_KEYS, raw=True)  # the digest is of the bytes as read
    model, pre, raw = (meta.get(_TOKENIZER + k) for k in ("model", "pre", "tokens"))
    bos, eos = (meta.get(_TOKENIZER + k, -1) for k in ("bos_token_id", "eos_token_id"))
    if not isinstance(model, str) or not isinstance(raw, list):
        raise GGUFError("GGUF file has no tokenizer (tokenizer.ggml.model and .tokens)")
    if (raw and not isinstance(raw[0], bytes)) or not isinstance(pre, (str, type(None))) \
            or type(bos) is not int or type(eos) is not int:
        raise GGUFError("malformed GGUF tokenizer: tokens, pre, bos or eos of the wrong type")
    info = TokenizerInfo(model, pre or "", bos, eos, len(raw), _digest(raw))
    return info, _texts(raw)


def tokenizer_of(path: str | os.PathLike) -> tuple[TokenizerInfo, list[str]]:
    """:func:`read_tokenizer` of the local file at ``path``."""
    with open(path, "rb") as fh:
        return read_tokenizer(fh)


def compatible(target_tokens: Sequence[str], target: TokenizerInfo, draft: TokenizerInfo, *,
               max_size_difference: int = 128) -> str | None:
    """None if ``draft`` can draft for ``target``, else a short reason why not.

    The runtime's rule (edgespec.runtime.backend.check_compatible) judged from metadata: same
    tokenizer type, vocab sizes within ``max_size_difference``, same BOS/EOS, and the target's
    first ``draft.n_tokens`` texts hashing to the draft's digest. A draft with the larger
    vocabulary cannot be judged from its digest alone, and is refused saying so.
    """
    if len(target_tokens) != target.n_tokens:
        raise ValueError(f"{len(target_tokens)} target tokens for {target.n_tokens} in the target")
    if target.model != draft.model:
        return f"tokenizer types differ ({target.model} vs {draft.model})"
    if abs(target.n_tokens - draft.n_tokens) > max_size_difference:
        return f"vocabulary sizes differ ({target.n_tokens} vs {draft.n_tokens})"
    if (target.bos, target.eos) != (draft.bos, draft.eos):
        return (f"special tokens differ (BOS/EOS {target.bos}/{target.eos} "
                f"vs {draft.bos}/{draft.eos})")
    if target.n_tokens < draft.n_tokens:
        return "the draft's vocabulary is larger than the target's: cannot be judged from metadata"
    if tokens_digest(target_tokens, draft.n_tokens) != draft.tokens_sha256:
        return f"token texts differ within the first {draft.n_tokens} tokens"
    return None


# ---------------------------------------------------------------------------- architecture

#: llama.cpp's architectures (``general.architecture``) whose layers keep a recurrent state
#: beside attention layers: ``llm_arch_is_hybrid`` in llama.cpp's src/llama-arch.cpp. Such a
#: model's context cannot simply drop its last tokens (a rejected draft): the recurrent state
#: has to be restored from a copy kept before them.
HYBRID_ARCHS = frozenset({
    "falcon-h1", "granitehybrid", "jamba", "kimi-linear", "lfm2", "lfm2moe", "nemotron_h",
    "nemotron_h_moe", "plamo2", "qwen35", "qwen35moe", "qwen3next",
})
#: Architectures with recurrent layers only, no attention: ``llm_arch_is_recurrent``.
RECURRENT_ARCHS = frozenset({"arwkv7", "mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7"})

_ARCH_KEY = "general.architecture"
_MTP_SUFFIX = ".nextn_predict_layers"


def arch_kind(arch: str | None) -> str:
    """``"hybrid"``, ``"recurrent"`` or ``"attention"`` (any other architecture, known or not;
    ``None`` or ``""`` too) for a llama.cpp architecture name."""
    if arch in HYBRID_ARCHS:
        return "hybrid"
    if arch in RECURRENT_ARCHS:
        return "recurrent"
    return "attention"


@dataclass(frozen=True)
class ArchInfo:
    """What a GGUF header says of the model's layers (see :func:`arch_of`)."""

    arch: str  #: general.architecture, e.g. "qwen35"; "" when the header names none
    mtp_layers: int = 0  #: <arch>.nextn_predict_layers: its multi-token-prediction layers

    @property
    def kind(self) -> str:
        """:func:`arch_kind` of the architecture."""
        return arch_kind(self.arch)

    @property
    def hybrid(self) -> bool:
        """Recurrent layers beside attention (:data:`HYBRID_ARCHS`)."""
        return self.kind == "hybrid"

    @property
    def recurrent(self) -> bool:
        """Recurrent layers only (:data:`RECURRENT_ARCHS`)."""
        return self.kind == "recurrent"

    def describe(self) -> str:
        """``qwen35, hybrid, MTP layers: 1``; a plain attention model is its architecture alone."""
        parts = [self.arch or "unknown architecture"]
        if self.kind != "attention":
            parts.append(self.kind)
        if self.mtp_layers:
            parts.append(f"MTP layers: {self.mtp_layers}")
        return ", ".join(parts)


class _ArchKeys:
    """The keys :func:`read_arch` keeps: the architecture, and any architecture's MTP count
    (which architecture is not known until its key is read)."""

    def __contains__(self, key: object) -> bool:
        return key == _ARCH_KEY or (isinstance(key, str) and key.endswith(_MTP_SUFFIX))


def read_arch(fh: BinaryIO) -> ArchInfo:
    """The architecture and MTP layer count, from the GGUF header read from ``fh`` (as
    :func:`read_metadata` reads it). Raises GGUFError, also for values of the wrong type."""
    meta = _metadata(fh, _ArchKeys(), raw=False)
    arch = meta.get(_ARCH_KEY, "")
    if not isinstance(arch, str):
        raise GGUFError(f"malformed GGUF header: {_ARCH_KEY} is not a string")
    layers = meta.get(arch + _MTP_SUFFIX, 0) if arch else 0
    if type(layers) is not int or layers < 0:
        raise GGUFError(f"malformed GGUF header: {arch}{_MTP_SUFFIX} is {layers!r}, "
                        "not a count of layers")
    return ArchInfo(arch, layers)


def arch_of(path: str | os.PathLike) -> ArchInfo:
    """:func:`read_arch` of the local file at ``path``: its architecture, whether that is hybrid
    or recurrent, and how many MTP (multi-token-prediction, "nextn") layers it carries."""
    with open(path, "rb") as fh:
        return read_arch(fh)
