"""Writing a GGUF file as llama.cpp's split shards, as ``llama-gguf-split --split`` does.

Shard ``i`` of ``n`` is ``<stem>-<i+1:05d>-of-<n:05d>.gguf``, a GGUF v3 file of its own. The
first carries every original key/value (copied byte for byte) and the others none, and each
then carries ``split.no`` (u16, 0-based), ``split.count`` (u16) and ``split.tensors.count``
(i32, all tensors): llama-model-loader reads those with type-checked getters, so the types
matter. The tensors are dealt out in order; each shard's tensor infos give offsets within its
own data section, whose tensors lie padded to the alignment as in the original.
"""

from __future__ import annotations

import struct
from pathlib import Path

from edgespec.models.gguf_meta import _U32, _U64, _header, _Reader

_ALIGNMENT_KEY = "general.alignment"


def _string(s: str) -> bytes:
    raw = s.encode()
    return _U64.pack(len(raw)) + raw


def _kv(key: str, vtype: int, fmt: str, value: int) -> bytes:
    return _string(key) + _U32.pack(vtype) + struct.pack("<" + fmt, value)


def _copy(src, dst, start: int, stop: int | None, chunk: int = 1 << 24) -> None:
    """Copy src[start:stop] (to the end if stop is None) into dst, a chunk at a time."""
    src.seek(start)
    left = None if stop is None else stop - start
    while left is None or left > 0:
        block = src.read(chunk if left is None else min(chunk, left))
        if not block:
            break
        dst.write(block)
        if left is not None:
            left -= len(block)


def split_gguf(src: Path, dest_dir: Path, parts: int) -> list[Path]:
    """Write ``src`` as ``parts`` llama.cpp split shards in ``dest_dir``; return their paths."""
    with open(src, "rb") as f:
        r = _Reader(f)
        n_tensors, n_kv = _header(r)
        kv_start, alignment = r.pos, 32
        for _ in range(n_kv):
            (key,) = r.strings(1)
            (vtype,) = r.take(_U32)
            value = r.value(vtype, keep=key == _ALIGNMENT_KEY)
            if key == _ALIGNMENT_KEY:
                alignment = value
        kv_stop = r.pos
        infos = []  # (bytes of name, dims and type; offset in the data section)
        for _ in range(n_tensors):
            start = r.pos
            r.strings(1, keep=False)
            (n_dims,) = r.take(_U32)
            r.take(struct.Struct(f"<{n_dims}QI"))
            infos.append((start, r.pos))
            r.take(_U64)
        data_start = -(-r.pos // alignment) * alignment
        f.seek(kv_start)
        kvs = f.read(kv_stop - kv_start)
        for i, (start, stop) in enumerate(infos):
            f.seek(stop)
            (offset,) = _U64.unpack(f.read(8))
            f.seek(start)
            infos[i] = (f.read(stop - start), offset)

        if not 1 <= parts <= n_tensors:
            raise ValueError(f"cannot split {n_tensors} tensors into {parts} parts")
        bounds = [k * n_tensors // parts for k in range(parts + 1)]
        paths = []
        for k in range(parts):
            path = dest_dir / f"{src.stem}-{k + 1:05d}-of-{parts:05d}.gguf"
            mine = infos[bounds[k]:bounds[k + 1]]
            base = mine[0][1]
            split_kvs = (_kv("split.no", 2, "H", k) + _kv("split.count", 2, "H", parts)
                         + _kv("split.tensors.count", 5, "i", n_tensors))
            n_own = n_kv + 3 if k == 0 else 3
            if k == 0:
                split_kvs = kvs + split_kvs
            elif alignment != 32:  # the other shards must pad as the original does too
                split_kvs += _kv(_ALIGNMENT_KEY, 4, "I", alignment)
                n_own += 1
            header = b"GGUF" + struct.pack("<IQQ", 3, len(mine), n_own) + split_kvs
            header += b"".join(info + _U64.pack(offset - base) for info, offset in mine)
            header += bytes(-len(header) % alignment)
            # Each shard's data runs to the next shard's first tensor: the padding comes along.
            stop = data_start + infos[bounds[k + 1]][1] if k + 1 < parts else None
            with open(path, "wb") as out:
                out.write(header)
                _copy(f, out, data_start + base, stop)
            paths.append(path)
    return paths
