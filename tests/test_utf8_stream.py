"""Streamed text is exact UTF-8, even when byte-level BPE splits a character across tokens.

The promise (issue 5): the text shown so far is always the UTF-8 decoding of the committed
tokens' bytes minus a trailing character that is still incomplete: no U+FFFD for bytes that the
next token may complete, no byte dropped, no byte of a rejected draft ever shown, and the chunks
joined are the whole text. Only when generation ends inside a character (max_tokens, EOG, full
context) do the incomplete bytes show, as one U+FFFD at the very end (TextStream.flush).

:func:`released` is an independent reference for "what may be shown of these bytes".
Scripted fakes build rejections in the middle of a character deterministically; the real tests
(marked ``real``) check the Python API, ``edgespec complete`` streaming and ``--json`` on the
tiny SmolLM2 (whose tokenizer splits emoji, CJK and some Greek into byte tokens) and on the
default Qwen pair (which splits rarer emoji and CJK only: the texts are chosen for it), each
test first asserting that its text really is split inside characters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgespec.core.rejection import Source
from edgespec.core.sampling import SamplingParams
from edgespec.core.textstream import TextStream

from .test_engine_fake import (
    EOG,
    UTF8_SCRIPT,
    VOCAB,
    build,
    complete,
    ids,
    prompt_len,
    stream,
)

GREEDY = SamplingParams(temperature=0)


# ---- the reference ---------------------------------------------------------------------------


def _utf8_length(lead: int) -> int:
    return 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4


def pending_tail(data: bytes) -> int:
    """Length of the incomplete character ``data`` ends with, if its next bytes could still
    complete it (0 otherwise: the end is complete, or invalid whatever follows)."""
    for n in range(1, min(4, len(data)) + 1):
        byte = data[-n]
        if byte < 0x80:
            return 0
        if byte < 0xC0:  # a continuation byte: its lead is further back
            continue
        need = _utf8_length(byte)
        if n >= need:
            return 0
        tail = data[-n:]
        if tail[0] == 0xED and n == 2 and tail[1] >= 0xA0:
            # A surrogate's prefix can never complete, but CPython's incremental decoder waits
            # for one more byte before replacing it: harmless (the U+FFFD comes a byte later).
            return n
        # 0x80, 0x90 or 0xA0 as the missing bytes completes every viable prefix (E0 needs
        # A0-BF next, F0 90-BF, ED and F4 80-..); C0, C1, F5-FF and the like never complete.
        for filler in (0x80, 0x90, 0xA0):
            try:
                (tail + bytes([filler]) * (need - n)).decode("utf-8")
                return n
            except UnicodeDecodeError:
                pass
        return 0
    return 0


def released(data: bytes) -> str:
    """What a stream may show of ``data`` so far: all of it decoded (U+FFFD for invalid bytes),
    except a trailing incomplete character that its next bytes could still complete."""
    return data[: len(data) - pending_tail(data)].decode("utf-8", errors="replace")


def inner_boundaries(pieces: list[bytes]) -> int:
    """How many boundaries between consecutive pieces fall inside a character."""
    data, n = b"", 0
    for piece in pieces[:-1]:
        data += piece
        n += pending_tail(data) > 0
    return n


def check_stream(chunks, token_bytes) -> bytes:
    """Check that ``chunks`` show the committed bytes as exact UTF-8; return those bytes.

    After every token, the text shown so far (the tokens' texts) equals :func:`released` of the
    bytes so far: a character appears with the token that completes it, never earlier (no
    U+FFFD for bytes the next token may complete), never later; a chunk's text is its tokens'
    texts; all chunks joined are the bytes decoded, the incomplete end (if any) as U+FFFD.
    """
    assert chunks and chunks[-1].finish_reason is not None
    assert all(c.finish_reason is None for c in chunks[:-1])
    data, shown = b"", ""
    for n, chunk in enumerate(chunks):
        final = n == len(chunks) - 1
        if chunk.tokens:
            assert chunk.text == "".join(t.text for t in chunk.tokens)
        else:
            assert final  # every round emits a token; only the end may add text alone
        for i, tok in enumerate(chunk.tokens):
            data += token_bytes(tok.id)
            shown += tok.text
            if not (final and i == len(chunk.tokens) - 1):  # the last one also gets the flush
                assert shown == released(data), (n, i, shown[-8:], data[-8:])
    if not chunks[-1].tokens:
        shown += chunks[-1].text
    assert "".join(c.text for c in chunks) == shown == data.decode("utf-8", errors="replace")
    return data


def corrections_inside_characters(chunks, token_bytes) -> int:
    """Rejections that happened in the middle of a character: corrected tokens that follow an
    incomplete character (the rejected draft token would have continued it)."""
    data, n = b"", 0
    for tok in (t for c in chunks for t in c.tokens):
        if tok.source == Source.CORRECTED and pending_tail(data):
            n += 1
        data += token_bytes(tok.id)
    return n


def test_reference_agrees_with_textstream_on_random_bytes():
    # valid and invalid UTF-8 (stray continuations, overlongs, surrogates, truncated, > U+10FFFF)
    rng = np.random.default_rng(0)
    pieces = [b"a", b"\n", "é".encode(), "€".encode(), "😀".encode(), b"\x80", b"\xbf", b"\xc0",
              b"\xc3", b"\xe0", b"\xe0\x80", b"\xed\xa0", b"\xf0", b"\xf0\x9f", b"\xf4\x90",
              b"\xf5", b"\xff", b"\x98\x80", b"\xa9"]
    for _ in range(300):
        data = b"".join(rng.choice(pieces, size=12))
        cuts = sorted(set(rng.integers(0, len(data) + 1, size=6)))
        s, shown = TextStream(), ""
        for a, b in zip([0, *cuts], [*cuts, len(data)]):
            shown += s.push(data[a:b])
            assert shown == released(data[:b]), data[:b]
        assert shown + s.flush() == data.decode("utf-8", errors="replace")


def test_reference_edge_cases():
    assert released(b"x\xf0\x9f\x98") == "x"
    assert released(b"x\xf0\x9f\x98\x80") == "x😀"
    assert released(b"x\xe0\x80") == "x\ufffd\ufffd"  # E0 80 can never complete
    assert released(b"x\xc3a") == "x\ufffda"
    assert inner_boundaries([b"\xf0\x9f", b"\x98\x80", b"a"]) == 1
    assert inner_boundaries(["é".encode(), b"a"]) == 0


# ---- rejections in the middle of a character (scripted fakes) ----------------------------------
# UTF8_SCRIPT (tests/test_engine_fake.py), by generated position:
#   0 "a" | 1 C3 | 2 A9 (é) | 3 "b" | 4 E2 | 5 82 AC (€) | 6 F0 9F | 7 98 80 (😀) | 8 "c"

[A] = ids("a")
[A9] = ids(b"\xa9")
[B82_AC] = ids(b"\x82\xac")
[F0_9F] = ids(b"\xf0\x9f")
TYPOS = {  # name -> (typos {position: drafted token}, draft lengths that draft every typo)
    # é's second byte drafted as "a": shown, it would be U+FFFD + "a"
    "e-acute-then-ascii": ({2: A}, [1, 3, 8]),
    # € = E2 82 AC drafted as E2 A9: an incomplete character that would wait for more
    "euro-wrong-continuation": ({5: A9}, [3, 4, 6]),
    # 😀 = F0 9F 98 80 drafted as F0 9F 82 AC, which is a valid other character: 🂬
    "emoji-completes-another-character": ({7: B82_AC}, [2, 4, 6, 8]),
    # a lead byte drafted where "b" follows: rejected, it must not linger in the decoder
    "stray-lead-byte": ({3: F0_9F}, [2, 4]),
    "all-at-once": ({2: A, 3: F0_9F, 5: A9, 7: B82_AC}, [3, 4, 8]),
}
SCRIPT_TEXT = "aéb€😀c"


@pytest.mark.parametrize("typos,k", [(typos, k) for typos, ks in TYPOS.values() for k in ks],
                         ids=[f"{name}-k{k}" for name, (_, ks) in TYPOS.items() for k in ks])
def test_draft_rejected_in_the_middle_of_a_character_never_shows(typos, k):
    # A typo on a round's bonus position is never drafted: the draft lengths per case are those
    # that draft every typo, at various places in a round (first draft, middle, last).
    wrong = list(UTF8_SCRIPT)
    for pos, tok in typos.items():
        wrong[pos] = tok
    leaked = b"".join(VOCAB[t] for t in wrong).decode("utf-8", errors="replace")
    assert leaked != SCRIPT_TEXT  # the draft's own text would be visibly wrong
    engine = build(UTF8_SCRIPT + [EOG], draft="typos", typos=typos, k=k)
    chunks = list(stream(engine))
    check_stream(chunks, engine.target.token_bytes)
    tokens = [t for c in chunks for t in c.tokens]
    assert [t.id for t in tokens] == UTF8_SCRIPT  # the target-only text
    assert "".join(c.text for c in chunks) == SCRIPT_TEXT
    # every typo was drafted (fed to the target at its position) and rejected there (greedy
    # target: p(typo) = 0) ...
    start = prompt_len()
    drafted = {call.pos + j - start for call in engine.target.calls[1:]
               for j, tok in enumerate(call.tokens[1:], 1) if typos.get(call.pos + j - start) == tok}
    assert drafted == set(typos)
    assert [i for i, t in enumerate(tokens) if t.source == Source.CORRECTED] == sorted(typos)
    # ... in the middle of a character, except the stray lead byte (at a character start)
    inside = sum(pos != 3 for pos in typos)
    assert corrections_inside_characters(chunks, engine.target.token_bytes) == inside
    # and the rejected bytes left nothing behind: no U+FFFD, no 🂬 (F0 9F 82 AC)
    assert all(not set(c.text) & set("\ufffd🂬") for c in chunks)


@pytest.mark.parametrize("setup", [dict(drafter="model", draft="perturbed"),
                                   dict(drafter="hybrid", draft="perturbed"),
                                   dict(drafter="lookup", draft=None)], ids=["model", "hybrid", "lookup"])
def test_sampled_byte_soup_with_many_rejections_streams_exactly(setup):
    # The fake vocabulary is mostly byte fragments: sampled text is full of split, completed
    # and invalid characters, and the perturbed draft is rejected often, also mid-character.
    inside = 0
    for seed in range(8):
        engine = build(**setup, k=3)
        params = SamplingParams(temperature=1.0, seed=seed)
        chunks = list(stream(engine, sampling=params, max_tokens=60))
        data = check_stream(chunks, engine.target.token_bytes)
        assert len(data) > 60
        inside += corrections_inside_characters(chunks, engine.target.token_bytes)
        assert complete(build(**setup, k=3), sampling=params, max_tokens=60).text == "".join(
            c.text for c in chunks)
    assert inside >= 5  # the case under test really happened, several times


@pytest.mark.parametrize("end", ["length", "eog", "context"])
def test_generation_ending_inside_a_character_shows_one_replacement_at_the_end(end):
    # Documented in TextStream.flush and Engine.stream: the incomplete bytes are not dropped
    # silently but shown as one U+FFFD, as the very last character (after it, nothing follows).
    script = ids("a", b"\xe2", b"\x82\xac", b"\xf0\x9f") + ([EOG] if end == "eog" else [])
    n_ctx = prompt_len() + 4 if end == "context" else 128
    engine = build(script, drafter="none", draft=None, n_ctx=n_ctx)
    chunks = list(stream(engine, max_tokens=4 if end == "length" else 50))
    assert chunks[-1].finish_reason == {"length": "length", "eog": "stop", "context": "context"}[end]
    check_stream(chunks, engine.target.token_bytes)
    text = "".join(c.text for c in chunks)
    assert text == "a€\ufffd"
    assert all("\ufffd" not in c.text for c in chunks[:-1])


# ---- real models ---------------------------------------------------------------------------------


def repeat_prompt(text: str) -> str:
    """A raw prompt small models continue by copying ``text``."""
    return f"Repeat: {text}\n{text}\nRepeat: {text}\n{text}\nRepeat: {text}\n"


#: The same characters in another order on each line: prompt lookup copies the bytes that
#: followed the same byte-token prefix last time, and at the byte that tells them apart (inside
#: the character) the target often disagrees: rejections mid-character, even when greedy.
TINY_EMOJI_MIX = "Emoji: 🎉🎊🎈🎁\nEmoji: 🎊🎁🎉🎈\nEmoji: 🎈🎉🎁🎊\nEmoji:"
TINY_CASES = {  # name -> (prompt, the text the greedy model copies first)
    # SmolLM2 splits every one of these emoji into 2-3 byte tokens (🎉 = F0 9F | 8E | 89) ...
    "emoji": (repeat_prompt("🎉👍🏽🇫🇷"), "🎉👍🏽🇫🇷"),
    # ... all of these CJK characters but 本 (你 = E4 BD | A0) ...
    "cjk": (repeat_prompt("你好世界, 日本語"), "你好世界, 日本語"),
    # ... and Ω (CE | A9); μέγα, é and ï are whole tokens here
    "accents": (repeat_prompt("Ωμέγα, café, naïve"), "Ωμέγα, café, naïve"),
    "emoji-mix": (TINY_EMOJI_MIX, " 🎉"),
}
#: Qwen2.5's 151k vocabulary has common emoji, CJK and accented letters as whole tokens: these
#: are the rarer ones it splits (🫠 = F0 9F | AB | A0, 龘 = E9 BE | 98, ṩ = E1 B9 | A9).
QWEN_EMOJI_MIX = "Emoji: 🫠🪐🪿🥲\nEmoji: 🪐🥲🫠🪿\nEmoji: 🪿🫠🥲🪐\nEmoji:"
QWEN_CASES = {
    "emoji-mix": (QWEN_EMOJI_MIX, " "),
    "cjk-accents": (repeat_prompt("龘靐鱻 ṩ"), "龘靐鱻 ṩ"),
}


def split_in_prompt(engine, text: str) -> int:
    """Boundaries inside characters when the target's tokenizer encodes ``text``."""
    target = engine.target
    return inner_boundaries([target.token_bytes(t) for t in target.tokenize(text, add_special=False)])


def stream_chunks(engine, prompt, **kw):
    return list(engine.stream(prompt, chat=False, **kw))


def token_pieces(engine, chunks) -> list[bytes]:
    return [engine.target.token_bytes(t.id) for c in chunks for t in c.tokens]


@pytest.mark.real
@pytest.mark.parametrize("case", TINY_CASES)
def test_tiny_greedy_stream_is_exact_utf8_for_every_drafter(tiny_engine, case):
    prompt, copied = TINY_CASES[case]
    engine = tiny_engine
    assert split_in_prompt(engine, prompt) > 0  # the tokenizer splits it
    ref = engine.complete(prompt, chat=False, max_tokens=30, sampling=GREEDY, drafter="none")
    # The model copies (whether it first writes "Repeat: " depends on the CPU's kernels): the
    # split characters are generated, not only in the prompt.
    assert copied in ref.text
    for drafter in ("lookup", "model", "hybrid"):
        chunks = stream_chunks(engine, prompt, max_tokens=30, sampling=GREEDY, drafter=drafter)
        check_stream(chunks, engine.target.token_bytes)
        assert inner_boundaries(token_pieces(engine, chunks)) > 0, drafter  # generated split too
        # exact speculative decoding: the same tokens and text as plain decoding
        assert [t.id for c in chunks for t in c.tokens] == [t.id for t in ref.tokens], drafter
        assert "".join(c.text for c in chunks) == ref.text, drafter
        if case == "emoji-mix" and drafter != "model":
            assert corrections_inside_characters(chunks, engine.target.token_bytes) >= 1, drafter


@pytest.mark.real
@pytest.mark.parametrize("drafter,case", [("lookup", "emoji-mix"), ("model", "cjk"),
                                          ("hybrid", "emoji-mix"), ("hybrid", "cjk")])
def test_tiny_sampled_stream_is_exact_utf8(tiny_engine, drafter, case):
    engine = tiny_engine
    # Whether a sampled answer writes a split character at all depends on the draws (the
    # model may answer in English): every stream must be exact, and seeds are tried until one
    # has generated a character split across tokens (the check is then not vacuous).
    split = 0
    for seed in range(7, 19):
        chunks = stream_chunks(engine, TINY_CASES[case][0], max_tokens=30, drafter=drafter,
                               sampling=SamplingParams(temperature=0.8, seed=seed))
        check_stream(chunks, engine.target.token_bytes)
        split = inner_boundaries(token_pieces(engine, chunks))
        if split:
            break
    assert split > 0


def cut_inside_a_character(pieces: list[bytes]) -> int:
    """The smallest n > 4 such that the first n pieces end inside a character."""
    data = b""
    for n, piece in enumerate(pieces, 1):
        data += piece
        if n > 4 and pending_tail(data):
            return n
    raise AssertionError("the text never stops inside a character")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("edgespec")
    return subprocess.run([str(exe), "complete", *args], capture_output=True, timeout=300,
                          env=dict(os.environ))


@pytest.mark.real
def test_cli_stream_and_json_match_the_api_byte_for_byte(tiny_engine):
    engine = tiny_engine
    prompt = TINY_CASES["cjk"][0]
    full = engine.complete(prompt, chat=False, max_tokens=30, sampling=GREEDY, drafter="hybrid")
    n = cut_inside_a_character([engine.target.token_bytes(t.id) for t in full.tokens])
    api = engine.complete(prompt, chat=False, max_tokens=n, sampling=GREEDY, drafter="hybrid")
    assert api.text.endswith("\ufffd") and api.text.count("\ufffd") == 1  # cut inside a character
    assert api.text[:-1] == released(b"".join(engine.target.token_bytes(t.id) for t in api.tokens))
    sampled = SamplingParams(temperature=0.8, seed=7)
    api_sampled = engine.complete(TINY_EMOJI_MIX, chat=False, max_tokens=40, sampling=sampled,
                                  drafter="lookup")
    runs = [  # (text, arguments, also with --json)
        (api.text, [prompt, "--raw", "--pair", "tiny", "--drafter", "hybrid", "-n", str(n),
                    "--temperature", "0"], True),
        (api_sampled.text, [TINY_EMOJI_MIX, "--raw", "--pair", "tiny", "--drafter", "lookup",
                            "-n", "40", "--temperature", "0.8", "--seed", "7"], False),
    ]
    for want, args, with_json in runs:
        streamed = run_cli(*args)
        assert streamed.returncode == 0, streamed.stderr.decode(errors="replace")
        text = streamed.stdout.decode("utf-8")  # strict: every byte on stdout is valid UTF-8
        assert text == want + "\n"
        if with_json:
            as_json = run_cli(*args, "--json")
            assert as_json.returncode == 0, as_json.stderr.decode(errors="replace")
            assert json.loads(as_json.stdout.decode("utf-8"))["text"] == want


@pytest.mark.real
@pytest.mark.slow
def test_default_pair_streams_rare_characters_exactly(default_engine):
    engine = default_engine
    for case, (prompt, copied) in QWEN_CASES.items():
        assert split_in_prompt(engine, prompt) > 0, case
        for params in (GREEDY, SamplingParams(temperature=0.7, seed=1)):
            chunks = stream_chunks(engine, prompt, max_tokens=24, sampling=params, drafter="hybrid")
            check_stream(chunks, engine.target.token_bytes)
            assert inner_boundaries(token_pieces(engine, chunks)) > 0, case
            if params is GREEDY:
                assert copied in "".join(c.text for c in chunks), case
                if case == "emoji-mix":
                    assert corrections_inside_characters(chunks, engine.target.token_bytes) >= 1


@pytest.mark.real
def test_cli_on_a_terminal_that_is_not_utf8_replaces_instead_of_crashing():
    prompt = TINY_CASES["cjk"][0]
    exe = Path(sys.executable).with_name("edgespec")
    for extra in ([], ["--json"]):
        res = subprocess.run([str(exe), "complete", prompt, "--raw", "--pair", "tiny", "-n", "12",
                              "--temperature", "0", *extra], capture_output=True, timeout=300,
                             env=dict(os.environ, PYTHONIOENCODING="latin-1"))
        assert res.returncode == 0, res.stderr.decode(errors="replace")
        assert b"Traceback" not in res.stderr
        if not extra:  # CJK has no latin-1 form: shown as "?", the rest of the line intact
            assert b"?" in res.stdout and res.stdout.endswith(b"\n")
        else:  # JSON escapes it instead: nothing lost, the same text as on a UTF-8 stdout
            utf8 = subprocess.run(res.args, capture_output=True, timeout=300,
                                  env=dict(os.environ, PYTHONIOENCODING="utf-8"))
            text = json.loads(res.stdout)["text"]
            assert text == json.loads(utf8.stdout)["text"] and any(ord(c) > 0x2E80 for c in text)
