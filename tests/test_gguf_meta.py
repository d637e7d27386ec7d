"""edgespec.models.gguf_meta: the GGUF header reader, on tiny files built here and on the real
cached models (``real``: checked against llama.cpp's own reading of them)."""

from __future__ import annotations

import hashlib
import io
import struct
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgespec.models import gguf_meta
from edgespec.models.gguf_meta import (
    GGUFError,
    TokenizerInfo,
    compatible,
    read_metadata,
    read_tokenizer,
    tokens_digest,
)

from .gguf_split import split_gguf

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_FMT = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?",
        U64: "Q", I64: "q", F64: "d"}


def _value(vtype: int, value) -> bytes:
    if vtype == STRING:
        raw = value if isinstance(value, bytes) else value.encode()
        return struct.pack("<Q", len(raw)) + raw
    if vtype == ARRAY:
        etype, items = value
        return struct.pack("<IQ", etype, len(items)) + b"".join(_value(etype, v) for v in items)
    return struct.pack("<" + _FMT[vtype], value)


def gguf(kvs: list[tuple[str, int, object]], *, version: int = 3) -> bytes:
    """A GGUF file with these (key, type, value) pairs and no tensors; an array's value is
    (element type, items)."""
    out = [b"GGUF", struct.pack("<IQQ", version, 0, len(kvs))]
    for key, vtype, value in kvs:
        out += [_value(STRING, key), struct.pack("<I", vtype), _value(vtype, value)]
    return b"".join(out)


def tokenizer_file(tokens: list[str | bytes]) -> bytes:
    return gguf([("general.architecture", STRING, "llama"),
                 ("tokenizer.ggml.model", STRING, "gpt2"),
                 ("tokenizer.ggml.pre", STRING, "test"),
                 ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
                 ("tokenizer.ggml.merges", ARRAY, (STRING, ["a b"] * 3)),
                 ("tokenizer.ggml.bos_token_id", U32, 1),
                 ("tokenizer.ggml.eos_token_id", U32, 2)])


class OnlyRead:
    """A raw, unbuffered file-like object with nothing but ``read``: counts calls and bytes."""

    def __init__(self, data: bytes) -> None:
        self._data, self.calls, self.given = data, 0, 0

    def read(self, n: int) -> bytes:
        self.calls += 1
        out = self._data[self.given:self.given + n]
        self.given += len(out)
        return out


def test_scalars_strings_and_arrays():
    kvs = [("u8", U8, 255), ("i8", I8, -128), ("u16", U16, 65535), ("i16", I16, -32768),
           ("u32", U32, 2**32 - 1), ("i32", I32, -(2**31)), ("f32", F32, 1.5), ("bool", BOOL, True),
           ("u64", U64, 2**64 - 1), ("i64", I64, -(2**63)), ("f64", F64, 0.1),
           ("str", STRING, "héllo ✓"), ("empty", STRING, ""),
           ("ints", ARRAY, (I32, [1, -2, 3])), ("floats", ARRAY, (F32, [0.5, -2.0])),
           ("bools", ARRAY, (BOOL, [True, False])), ("strs", ARRAY, (STRING, ["a", "", "ü"])),
           ("none", ARRAY, (U8, []))]
    meta = read_metadata(io.BytesIO(gguf(kvs)))
    expected = {key: (value[1] if vtype == ARRAY else value) for key, vtype, value in kvs}
    assert meta == expected
    assert type(meta["bool"]) is bool and type(meta["u8"]) is int and type(meta["f32"]) is float


def test_version_2_reads_as_3():
    assert read_metadata(io.BytesIO(gguf([("k", U32, 7)], version=2))) == {"k": 7}


def test_keys_keeps_only_those_and_parses_past_the_rest(monkeypatch):
    data = gguf([("skip.str", STRING, "x" * 1000), ("skip.strs", ARRAY, (STRING, ["ab"] * 500)),
                 ("keep.a", U16, 3), ("skip.ints", ARRAY, (U64, list(range(100)))),
                 ("skip.u8", U8, 1), ("keep.b", ARRAY, (STRING, ["p", "q"])), ("keep.c", F64, 2.5)])
    decoded = []
    texts = gguf_meta._texts
    monkeypatch.setattr(gguf_meta, "_texts", lambda raws: decoded.append(raws) or texts(raws))
    meta = read_metadata(io.BytesIO(data), keys={"keep.a", "keep.b", "keep.c", "absent"})
    assert meta == {"keep.a": 3, "keep.b": ["p", "q"], "keep.c": 2.5}
    assert decoded == [[b"p", b"q"]]  # the skipped string array was passed over, not decoded
    assert read_metadata(io.BytesIO(data), keys=()) == {}


def test_a_token_that_is_not_utf8_keeps_its_bytes():
    info, tokens = read_tokenizer(io.BytesIO(tokenizer_file(["a", b"\xff"])))
    assert tokens[1].encode("utf-8", "surrogateescape") == b"\xff"
    raw = b"\x01\x00\x00\x00a" + b"\x01\x00\x00\x00\xff"
    assert info.tokens_sha256 == hashlib.sha256(raw).hexdigest()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=6).filter(lambda b: b"\xff" not in b), max_size=8))
def test_string_arrays_decode_as_each_string_alone(raws):
    # they are decoded joined at 0xFF: no string's bytes, valid UTF-8 or not, may run into the next
    texts = read_metadata(io.BytesIO(gguf([("k", ARRAY, (STRING, raws))])))["k"]
    assert texts == [r.decode("utf-8", "surrogateescape") for r in raws]


@pytest.mark.parametrize("raws", [[b"\xe2\x82", b"\x82a", b"\xf0", b"\xed\xb3\xbf", b""],
                                  [b"a\xff", b"\xff", b"\xe2"]])
def test_string_arrays_keep_every_byte(raws):
    texts = read_metadata(io.BytesIO(gguf([("k", ARRAY, (STRING, raws))])))["k"]
    assert [t.encode("utf-8", "surrogateescape") for t in texts] == raws


@pytest.mark.parametrize("data", [b"", b"GG", b"GGUX\x03\x00\x00\x00", b"<!DOCTYPE html>"])
def test_bad_magic(data):
    with pytest.raises(GGUFError, match=r"^not a GGUF file \(starts with b'"):
        read_metadata(io.BytesIO(data))


@pytest.mark.parametrize("version", [0, 1, 4, 3 << 24])
def test_bad_version(version):
    with pytest.raises(GGUFError, match=f"unsupported GGUF version {version}"):
        read_metadata(io.BytesIO(gguf([], version=version)))


def test_every_truncation_is_an_error():
    data = tokenizer_file(["a", "bc", "déf"])
    for cut in range(4, len(data)):
        with pytest.raises(GGUFError, match="^truncated GGUF header$"):
            read_metadata(io.BytesIO(data[:cut]))
    assert read_metadata(io.BytesIO(data))["tokenizer.ggml.tokens"] == ["a", "bc", "déf"]


@pytest.mark.parametrize("value, what", [
    (struct.pack("<I", 13), "unknown value type 13"),
    (struct.pack("<IIQ", ARRAY, 13, 0), "unknown array element type 13"),
    # nested arrays: llama.cpp refuses them too
    (struct.pack("<IIQ", ARRAY, ARRAY, 0), "unknown array element type 9"),
])
def test_unknown_types(value, what):
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _value(STRING, "k") + value
    with pytest.raises(GGUFError, match=what):
        read_metadata(io.BytesIO(data))


def test_an_absurd_string_length_is_refused_without_reading_on():
    data = gguf([("k", STRING, "v")]).replace(struct.pack("<Q", 1) + b"v", struct.pack("<Q", 2**62))
    with pytest.raises(GGUFError, match="malformed GGUF header: a string of"):
        read_metadata(io.BytesIO(data + bytes(100)))


def test_reads_a_raw_object_in_few_large_calls_and_stops_near_the_header():
    tokens = [f"tok{i}" for i in range(200_000)]
    data = tokenizer_file(tokens)
    tensor_data = bytes(8 << 20)
    raw = OnlyRead(data + tensor_data)
    info, got = read_tokenizer(raw)
    assert got == tokens and info.n_tokens == len(tokens)
    assert raw.calls <= len(data) // gguf_meta._CHUNK + 2, raw.calls
    assert raw.given <= len(data) + gguf_meta._CHUNK


def test_tokenizer_defaults_and_absence():
    data = gguf([("tokenizer.ggml.model", STRING, "llama"),
                 ("tokenizer.ggml.tokens", ARRAY, (STRING, ["<s>", "x"]))])
    info, tokens = read_tokenizer(io.BytesIO(data))
    assert (info.model, info.pre, info.bos, info.eos, info.n_tokens) == ("llama", "", -1, -1, 2)
    assert tokens == ["<s>", "x"] and info.tokens_sha256 == tokens_digest(tokens)
    with pytest.raises(GGUFError, match="no tokenizer"):
        read_tokenizer(io.BytesIO(gguf([("general.architecture", STRING, "llama")])))
    with pytest.raises(GGUFError, match="wrong type"):
        read_tokenizer(io.BytesIO(gguf([("tokenizer.ggml.model", STRING, "llama"),
                                        ("tokenizer.ggml.tokens", ARRAY, (U32, [1]))])))


def test_tokens_digest_is_of_length_prefixed_texts_and_extends_to_prefixes():
    tokens = ["a", "", "ü", "hello"]
    raw = b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in tokens)
    assert tokens_digest(tokens) == hashlib.sha256(raw).hexdigest()
    assert tokens_digest(tokens, None) == tokens_digest(tokens, 4)
    for n in range(5):
        assert tokens_digest(tokens, n) == tokens_digest(tokens[:n])
    assert tokens_digest([]) == hashlib.sha256(b"").hexdigest()
    # the length prefix keeps ["ab", "c"] apart from ["a", "bc"]
    assert tokens_digest(["ab", "c"]) != tokens_digest(["a", "bc"])
    with pytest.raises(ValueError):
        tokens_digest(tokens, 5)


def _info(tokens: list[str], model: str = "gpt2", bos: int = 1, eos: int = 2) -> TokenizerInfo:
    return TokenizerInfo(model, "test", bos, eos, len(tokens), tokens_digest(tokens))


def test_compatible_each_reason():
    vocab = [f"t{i}" for i in range(300)]
    target = _info(vocab)
    assert compatible(vocab, target, target) is None
    # a draft with up to 128 fewer tokens (padding rows) is judged on the shared range
    assert compatible(vocab, target, _info(vocab[:172])) is None
    assert compatible(vocab, target, _info(vocab[:171])) == "vocabulary sizes differ (300 vs 171)"
    assert compatible(vocab, target, _info(vocab[:171]), max_size_difference=129) is None
    assert compatible(vocab, target, _info(vocab, model="llama")) == \
        "tokenizer types differ (gpt2 vs llama)"
    assert compatible(vocab, target, _info(vocab, eos=3)) == \
        "special tokens differ (BOS/EOS 1/2 vs 1/3)"
    assert compatible(vocab, target, _info(vocab, bos=0)) == \
        "special tokens differ (BOS/EOS 1/2 vs 0/2)"
    assert compatible(vocab, target, _info(vocab + ["extra"])) == \
        "the draft's vocabulary is larger than the target's: cannot be judged from metadata"
    changed = vocab[:100] + ["other"] + vocab[101:200]
    assert compatible(vocab, target, _info(changed)) == \
        "token texts differ within the first 200 tokens"
    with pytest.raises(ValueError):
        compatible(vocab[:10], target, target)


# --- the real models -----------------------------------------------------------------------

QWEN_FILES = ("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
SMOL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _cached(name: str) -> Path:
    from edgespec.models.download import models_dir

    path = models_dir() / name
    if not path.is_file():
        pytest.skip(f"{name} is not in the model cache")
    return path


@pytest.mark.real
def test_the_qwen_pair_has_one_tokenizer():
    infos = []
    for name in QWEN_FILES:
        start = time.perf_counter()
        info, tokens = gguf_meta.tokenizer_of(_cached(name))
        print(f"{name}: {info.tokens_sha256} ({time.perf_counter() - start:.3f} s)")
        assert (info.model, info.pre, info.bos, info.eos, info.n_tokens) == \
            ("gpt2", "qwen2", 151643, 151645, 151936)
        infos.append((info, tokens))
    (target, target_tokens), (draft, _) = infos
    assert target.tokens_sha256 == draft.tokens_sha256
    assert compatible(target_tokens, target, draft) is None


@pytest.mark.real
def test_reading_the_qwen_tokenizer_is_quick():
    path = _cached(QWEN_FILES[0])
    best = min(_timed(path) for _ in range(3))
    print(f"read_tokenizer({path.name}): {best:.3f} s")
    assert best < 1.0  # about 0.2 s measured; generous against a busy machine


def _metadata(path: Path) -> dict[str, object]:
    with open(path, "rb") as fh:
        return read_metadata(fh)


def _timed(path: Path) -> float:
    start = time.perf_counter()
    gguf_meta.tokenizer_of(path)
    return time.perf_counter() - start


@pytest.mark.real
def test_smollm2_cannot_draft_for_qwen():
    qwen, qwen_tokens = gguf_meta.tokenizer_of(_cached(QWEN_FILES[0]))
    smol, smol_tokens = gguf_meta.tokenizer_of(_cached(SMOL_FILE))
    assert compatible(qwen_tokens, qwen, smol) == "vocabulary sizes differ (151936 vs 49152)"
    assert compatible(smol_tokens, smol, qwen) == "vocabulary sizes differ (49152 vs 151936)"


@pytest.mark.real
@pytest.mark.parametrize("name", [SMOL_FILE, QWEN_FILES[1]])
def test_token_texts_match_llama_cpp(name):
    import edgespec  # noqa: F401  (loads llama.cpp's library the way the package needs)
    import llama_cpp

    path = _cached(name)
    info, tokens = gguf_meta.tokenizer_of(path)
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    assert llama_cpp.llama_vocab_n_tokens(vocab) == info.n_tokens
    ids = sorted({*range(0, info.n_tokens, 331), *range(info.n_tokens - 300, info.n_tokens),
                  *range(300), info.bos, info.eos})
    for i in ids:
        assert llama_cpp.llama_vocab_get_text(vocab, i) == \
            tokens[i].encode("utf-8", "surrogateescape"), i
    assert llama_cpp.llama_vocab_bos(vocab) == info.bos
    assert llama_cpp.llama_vocab_eos(vocab) == info.eos


@pytest.mark.real
def test_a_split_copy_loads_and_decodes_as_the_original(tmp_path):
    import edgespec  # noqa: F401
    import llama_cpp

    src = _cached(SMOL_FILE)
    parts = split_gguf(src, tmp_path, 3)
    assert [p.name for p in parts] == \
        [f"SmolLM2-135M-Instruct.Q4_1-0000{k}-of-00003.gguf" for k in (1, 2, 3)]
    metas = [_metadata(p) for p in parts]
    original = _metadata(src)
    assert {k: v for k, v in metas[0].items() if not k.startswith("split.")} == original
    assert [m.get("split.no") for m in metas] == [0, 1, 2]
    assert all(m["split.count"] == 3 and m["split.tensors.count"] == 272 for m in metas)
    assert all(len(m) == 3 for m in metas[1:])

    def greedy(path: Path) -> str:
        llm = llama_cpp.Llama(model_path=str(path), n_ctx=256, verbose=False)
        out = llm.create_completion("The capital of France is", temperature=0, max_tokens=8)
        return out["choices"][0]["text"]

    expected = greedy(src)
    assert expected.strip()
    assert greedy(parts[0]) == expected
