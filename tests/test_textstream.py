"""TextStream: token bytes in, final text out (incremental UTF-8, stop strings held back)."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.core.textstream import TextStream


def feed(stream: TextStream, pieces) -> list[str]:
    return [stream.push(p if isinstance(p, bytes) else p.encode()) for p in pieces]


# ---- UTF-8 ---------------------------------------------------------------------------------


@pytest.mark.parametrize("char", ["é", "€", "😀"])
def test_multibyte_character_split_byte_by_byte_waits_for_its_last_byte(char):
    data = char.encode()
    s = TextStream()
    out = feed(s, [data[i : i + 1] for i in range(len(data))])
    assert out == [""] * (len(data) - 1) + [char]
    assert s.flush() == ""


def test_characters_split_across_pieces_at_any_point():
    text = "aé€😀b ok"
    data = text.encode()
    for cut in range(len(data) + 1):
        s = TextStream()
        out = s.push(data[:cut]) + s.push(data[cut:]) + s.flush()
        assert out == text
        assert "\ufffd" not in out


def test_invalid_bytes_become_replacement_characters_not_errors():
    s = TextStream()
    assert s.push(b"a\xffb") == "a\ufffdb"


def test_flush_turns_an_incomplete_character_into_one_replacement():
    s = TextStream()
    assert s.push(b"x\xe2\x82") == "x"
    assert s.flush() == "\ufffd"
    assert s.flush() == ""  # nothing is released twice


# ---- stop strings --------------------------------------------------------------------------


def test_possible_stop_prefix_is_held_back_then_released():
    s = TextStream(["END"])
    assert s.push(b"abE") == "ab"
    assert s.push(b"N") == ""
    assert s.push(b"x") == "ENx"
    assert not s.stopped


def test_stop_string_across_pushes_stops_and_drops_the_rest():
    s = TextStream(["END"])
    assert feed(s, ["ab", "E", "N", "Dxyz"]) == ["ab", "", "", ""]
    assert s.stopped
    assert s.push(b"more") == "" and s.flush() == ""


def test_stop_string_inside_one_push():
    s = TextStream(["\n\n"])
    assert s.push(b"one\n\ntwo") == "one"
    assert s.stopped


def test_earliest_of_several_stop_strings_wins():
    s = TextStream(["xyz", "b"])
    assert s.push(b"axyzb") == "a"
    s = TextStream(["abcd", "bc"])
    assert s.push(b"abc") == "a"  # "bc" completes before "abcd" could


def test_longest_held_prefix_over_several_stops():
    s = TextStream(["abX", "bY"])
    assert s.push(b"zab") == "z"  # "ab" may start "abX"
    assert s.push(b"Y") == "a"  # "bY" is a stop: "a" is final, the rest dropped
    assert s.stopped


def test_overlapping_stop_prefixes():
    s = TextStream(["aab"])
    assert feed(s, ["a", "a", "a", "b"]) == ["", "", "a", ""]
    assert s.stopped


def test_flush_releases_a_held_prefix_that_never_completed():
    s = TextStream(["END"])
    assert s.push(b"abEN") == "ab"
    assert s.flush() == "EN"


def test_stop_string_with_a_multibyte_character_split_across_tokens():
    s = TextStream(["é!"])
    data = "ok é!".encode()
    out = feed(s, [data[i : i + 1] for i in range(len(data))])
    assert "".join(out) == "ok " and s.stopped


def test_empty_stop_strings_are_ignored():
    s = TextStream(["", "zz"])
    assert s.push(b"abc") == "abc"
    assert not s.stopped


@pytest.mark.parametrize("seed", range(5))
def test_random_splits_match_the_reference(seed):
    # Any split of the byte stream gives the text up to the first stop, released no later than
    # one stop-string length minus one behind the input.
    rng = np.random.default_rng(seed)
    alphabet = ["a", "b", "c", "é", "€", "\n"]
    stops = ["ab\n", "c€c", "éé"]
    text = "".join(rng.choice(alphabet, size=200))
    firsts = [i for i in (text.find(s) for s in stops) if i >= 0]
    want = text[: min(firsts)] if firsts else text
    data = text.encode()
    cuts = sorted(rng.choice(len(data), size=60, replace=False))
    s = TextStream(stops)
    got = ""
    for a, b in zip([0, *cuts], [*cuts, len(data)]):
        got += s.push(data[a:b])
        seen = data[:b].decode("utf-8", errors="ignore")
        if not s.stopped:
            assert want.startswith(got)
            assert len(seen) - len(got) <= max(map(len, stops)) - 1
    got += s.flush()
    assert got == want
    assert s.stopped == bool(firsts)
