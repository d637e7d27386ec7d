"""The compiled row passes (edgespec/core/_rows.c) against NumPy and float64.

The sampler's property tests run through them too (they are on by default; the NumPy and
ggml paths are tested there with them switched off): these check the passes themselves,
at the sizes where vector and block boundaries fall.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgespec.core import rowpass
from edgespec.core.dist import BLOCK, block_sums

ROWS = rowpass.rows()
needs_rows = pytest.mark.skipif(ROWS is None, reason="the row passes are not compiled here")

#: sizes around the kernels' vector width (8) and block (256), and the default vocabulary
SIZES = [1, 7, 8, 9, 255, 256, 257, 4099, 151_936]


def test_the_row_passes_are_built_here():
    """`pip install -e .` compiles them with the tests' install: a silent fall-back to NumPy
    would cost ~1.5x per whole-row exp and ~4x per membership test of a flat nucleus."""
    assert ROWS is not None
    assert rowpass.describe() == "compiled row passes"


@needs_rows
def test_exp_is_within_2e_7_of_float64_everywhere():
    # every float32 step of 6e-5 over the range where weights live; subnormals at their scale
    x = np.linspace(-110.0, 0.0, 1_800_001).astype(np.float32)
    out = np.empty_like(x)
    total = ROWS.scaled_exp(x, out, 0.0, 1.0)
    want = np.exp(x.astype(np.float64))
    np.testing.assert_allclose(out, want, rtol=2e-7, atol=1e-44)
    assert total == pytest.approx(want.sum(), rel=1e-7)
    edge = np.array([-np.inf, -1e30, -110.0, -104.0, -103.9, -87.4, 0.0, 80.0], np.float32)
    got = np.empty_like(edge)
    ROWS.scaled_exp(edge, got, 0.0, 1.0)
    np.testing.assert_allclose(got, np.exp(edge.astype(np.float64)), rtol=2e-7, atol=1e-44)
    assert got[0] == got[1] == got[2] == 0.0


@needs_rows
@pytest.mark.parametrize("precise", [False, True])
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("t", [1.0, 0.8, 0.3])
def test_scaled_exp_takes_numpys_argument_and_gives_block_sums(size, t, precise):
    rng = np.random.default_rng(size)
    x = rng.normal(0, 4, size).astype(np.float32)
    x[1::5] = -np.inf
    top = float(x.max())
    inv = 1.0 if t == 1.0 else float(np.float32(1.0 / t))
    arg = x - np.float32(top)
    if t != 1.0:
        arg *= np.float32(inv)  # NumPy's two roundings, which the pass repeats
    padded = np.zeros(-(-size // BLOCK) * BLOCK, np.float32)
    blocks = np.full(padded.size // BLOCK, np.nan)
    total = ROWS.scaled_exp(x, padded, top, inv, blocks, precise)
    want = np.exp(arg.astype(np.float64))
    np.testing.assert_allclose(padded[:size], want, rtol=2e-7, atol=1e-44)
    assert not padded[size:].any()  # (past the row: untouched)
    assert total == pytest.approx(want.sum(), rel=1e-6)
    wide = padded.astype(np.float64)
    per_block = wide.reshape(-1, BLOCK).sum(axis=1)
    if precise:
        # float64 sums of the float32 weights (each added as a double: a top-p cut is placed
        # against the total); only the order of additions differs: 8 lanes of n/8 in turn,
        # at most n/8 * 2**-53 = 2e-12 of the total for the default vocabulary (a block's
        # sum: 32 additions a lane, 4e-15)
        assert total == pytest.approx(wide.sum(), rel=1e-11)
        np.testing.assert_allclose(blocks, per_block, rtol=1e-13, atol=0)
    else:
        # float32 lanes within a block: 32 roundings a lane, then 8 lanes, each at most
        # 2**-24 of what it has summed: under 40 * 6e-8 = 2.4e-6 of a block's sum
        np.testing.assert_allclose(blocks, per_block, rtol=2.4e-6, atol=0)
        assert total == pytest.approx(wide.sum(), rel=2.4e-6)
    assert blocks.sum() == pytest.approx(total, rel=1e-12)
    np.testing.assert_allclose(blocks, block_sums(padded), rtol=1e-5, atol=0)  # (float32's)
    same = x.copy()
    ROWS.scaled_exp(same, same, top, inv)  # in place
    np.testing.assert_array_equal(same, padded[:size])


@needs_rows
@pytest.mark.parametrize("size", [5, 9, 63, 64, 65, 257, 151_936 + 7])
def test_tied_logits_get_one_weight_wherever_they_sit(size):
    x = np.zeros(size, np.float32)
    x[::3] = -1.7
    out = np.empty_like(x)
    ROWS.scaled_exp(x, out, 0.3, float(np.float32(1 / 0.7)))
    assert np.unique(out[x == 0]).size == 1 and np.unique(out[x != 0]).size == 1


@needs_rows
@pytest.mark.parametrize("size", SIZES)
def test_mass_before_is_the_mass_ahead_in_descending_order(size):
    rng = np.random.default_rng(size)
    x = rng.integers(-6, 6, size).astype(np.float32)  # many ties
    x[::7] = -np.inf
    w = rng.random(size).astype(np.float32)
    w[x == -np.inf] = 0.0
    for y in sorted({0, size // 3, size // 2, size - 1}):
        got = ROWS.mass_before(x, w, y)
        ahead = (x > x[y]) | ((x == x[y]) & (np.arange(size) < y))
        want = w[ahead].sum(dtype=np.float64)
        # float64 sums of the float32 weights: only the order of additions differs (at most
        # n/8 * 2**-53 of the mass, as for scaled_exp's total)
        assert abs(got - want) <= 1e-11 * w.sum(dtype=np.float64), (y, got, want)


@needs_rows
def test_the_passes_refuse_what_they_cannot_read():
    f32 = np.zeros(16, np.float32)
    with pytest.raises(TypeError, match="float32"):
        ROWS.scaled_exp(np.zeros(16), f32, 0.0, 1.0)
    with pytest.raises((ValueError, BufferError)):
        ROWS.scaled_exp(np.zeros(32, np.float32)[::2], f32, 0.0, 1.0)  # strided
    frozen = np.zeros(16, np.float32)
    frozen.flags.writeable = False
    with pytest.raises((ValueError, BufferError)):
        ROWS.scaled_exp(f32, frozen, 0.0, 1.0)
    assert ROWS.mass_before(frozen, frozen, 3) == 0.0  # (only reads: a read-only row is fine)
    with pytest.raises(ValueError, match="shorter"):
        ROWS.scaled_exp(f32, np.zeros(8, np.float32), 0.0, 1.0)
    with pytest.raises(ValueError, match="blocks"):
        ROWS.scaled_exp(f32, f32, 0.0, 1.0, np.zeros(1, np.float32))
    with pytest.raises(ValueError, match="outside"):
        ROWS.mass_before(f32, f32, 16)


def test_the_row_passes_can_be_switched_off():
    code = "from edgespec.core import rowpass; print(rowpass.rows() is None, rowpass.describe())"
    env = {"EDGESPEC_NUMPY_ROWS": "1", "PATH": "/usr/bin:/bin"}
    root = Path(__file__).resolve().parents[1]
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=root)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["True", "NumPy", "row", "passes"]


def test_info_says_which_row_passes_the_sampler_runs(monkeypatch):
    from click.testing import CliRunner

    from edgespec.cli.main import cli

    res = CliRunner().invoke(cli, ["info"])
    assert res.exit_code == 0, res.output
    assert "sampler:          compiled row passes" in res.output
    monkeypatch.setattr(rowpass, "_module", None)  # as where they were not built
    monkeypatch.delenv(rowpass.NO_ROWS, raising=False)
    res = CliRunner().invoke(cli, ["info"])
    assert "NumPy row passes (not compiled: install a C compiler, then `make setup`)" in res.output


# ---- a draft's window (`window`) and the ids at a floor (`at_least`) --------------------------


def _window_rows(size: int) -> dict[str, np.ndarray]:
    """Rows whose largest values sit early, late, in a ramp (each step a new max: the list
    fills and is cut again and again), among ties, and next to -inf."""
    rng = np.random.default_rng(size)
    bulk = rng.normal(0.0, 2.0, size).astype(np.float32)
    late = bulk.copy()
    late[-min(6, size):] += 12.0
    ramp = np.linspace(-5.0, 5.0, size).astype(np.float32)
    ties = rng.integers(0, 3, size).astype(np.float32)
    holes = bulk.copy()
    holes[::3] = -np.inf
    return {"bulk": bulk, "late": late, "ramp": ramp, "ties": ties, "holes": holes}


@needs_rows
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("keep", [1, 5, 64])
@pytest.mark.parametrize("offset", [-0.5, -7.4, -1e4])
@pytest.mark.parametrize("min_p", [None, -2.3])
def test_window_is_the_rows_largest_values_at_the_floor(size, keep, offset, min_p):
    for name, x in _window_rows(size).items():
        ids = np.full(keep + 192, -1, np.int64)
        top, count = ROWS.window(x, offset, -np.inf if min_p is None else min_p, keep, ids)
        if count < 0:  # ties at the keep-th largest value would fill half the list (the
            # pass stops there: the caller finds the window another way)
            kth = np.sort(x)[-keep]
            assert np.count_nonzero(x >= kth) > (keep + 192) // 2, name
            continue
        assert top == float(x.max()), name
        # the floor as draft_distribution computes it, then the keep largest (ties in)
        floor = float(np.float32(top + offset))
        if min_p is not None:
            floor = max(floor, top + min_p)
        want = np.flatnonzero(x >= np.float32(floor))
        if want.size > keep:
            want = want[x[want] >= np.sort(x[want])[want.size - keep]]
        np.testing.assert_array_equal(ids[:count], want, err_msg=name)


@needs_rows
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("keep", [1, 5, 40, 64])
def test_largest_lists_every_value_from_a_hair_below_the_keep_th(size, keep):
    for name, x in _window_rows(size).items():
        ids = np.full(keep + 192, -1, np.int64)
        top, count, floor = ROWS.largest(x, keep, ids)
        if count < 0:  # ties at the keep-th largest value would fill half the list
            kth = np.sort(x)[-keep]
            assert np.count_nonzero(x >= kth) > (keep + 192) // 2, name
            continue
        assert top == float(x.max()), name
        kth = np.sort(x)[max(size - keep, 0)]
        # (a hair: 1e-6 of it, as the pass rounds it in float32, so one float32 step of slack)
        hair = np.float32(kth - 1e-6 * (1 + abs(kth)))
        assert floor <= np.nextafter(hair, np.float32(np.inf)) or floor == -np.inf, name
        np.testing.assert_array_equal(ids[:count], np.flatnonzero(x >= np.float32(floor))
                                      if floor > -np.inf else np.arange(size), err_msg=name)


@needs_rows
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("keep", [1, 5, 40])
@pytest.mark.parametrize("t", [0.8, 1e-3, 1e-9])
def test_largest_with_a_temperature_cuts_to_top_ids_near_ties(size, keep, t):
    # the same set as the column maxima's top_ids (the k largest and every logit whose
    # float64 weight may round onto the k-th's), or -2 where the list may miss one of those
    rows = _window_rows(size)
    near = rows["bulk"].copy()
    if size > keep:  # logits a float32 step or two below the keep-th: inside 1e-9 or not
        kth = np.sort(near)[size - keep]
        near[: min(4, size)] = np.nextafter(kth, np.float32(-np.inf))
        near[-1] = np.nextafter(near[0], np.float32(-np.inf))
    rows["near"] = near
    for name, x in rows.items():
        if size <= keep:
            continue
        ids = np.full(keep + 192, -1, np.int64)
        top, count, floor = ROWS.largest(x, keep, ids, t)
        if count == -1:  # ties fill the list (the max is moot then): as without t
            assert ROWS.largest(x, keep, ids)[1] == -1, name
            continue
        assert top == float(x.max()), name
        if count == -2:  # only where the margin leaves the listed range or weights underflow
            kth = float(np.sort(x)[size - keep])
            margin = sampling._tie_floor(kth, top, t)
            assert margin is None or np.float32(margin) < floor, name
            continue
        want = _top_ids_reference(x, keep, t, top)
        if want is None:  # subnormal weights: top_ids takes another path
            pytest.fail(f"{name}: cut where top_ids would not be")
        np.testing.assert_array_equal(ids[:count], want, err_msg=name)
        assert floor == float(np.float32(sampling._tie_floor(
            float(np.sort(x)[size - keep]), top, t))), name


def _top_ids_reference(x: np.ndarray, k: int, t: float, top: float) -> np.ndarray | None:
    """_Maxima.top_ids's set, from a sort: ids of the logits at or above the k-th largest
    less _tie_floor's margin (None where that has none)."""
    floor = sampling._tie_floor(float(np.sort(x)[x.size - k]), top, t)
    return None if floor is None else np.flatnonzero(x >= np.float32(floor))


@needs_rows
def test_window_says_nan_and_needs_room():
    x = np.random.default_rng(0).normal(size=4096).astype(np.float32)
    x[3000] = np.nan
    assert np.isnan(ROWS.window(x, -7.0, -np.inf, 64, np.empty(256, np.int64))[0])
    with pytest.raises(ValueError, match="room"):
        ROWS.window(x, -7.0, -np.inf, 64, np.empty(100, np.int64))
    with pytest.raises(ValueError):
        ROWS.window(x, 1.0, -np.inf, 64, np.empty(256, np.int64))  # a floor above the max
    with pytest.raises(TypeError, match="int64"):
        ROWS.window(x, -7.0, -np.inf, 64, np.empty(256, np.int32))


@needs_rows
@pytest.mark.parametrize("size", SIZES)
def test_at_least_lists_the_ids_at_the_floor(size):
    for name, x in _window_rows(size).items():
        for floor in (-np.inf, -1.0, 0.0, 1.0, 4.0, 20.0):
            want = np.flatnonzero(x >= np.float32(floor))
            ids = np.empty(size + 1, np.int64)
            count = ROWS.at_least(x, floor, ids)
            np.testing.assert_array_equal(ids[:count], want, err_msg=name)
            # a list too short: it says so (the scan stops there)
            if want.size > 3:
                short = np.empty(3, np.int64)
                assert ROWS.at_least(x, floor, short) == 4
                np.testing.assert_array_equal(short, want[:3])
    with pytest.raises(TypeError, match="int64"):
        ROWS.at_least(np.zeros(9, np.float32), 0.0, np.empty(9))


# ---- a candidate set's filters in one call (`filtered`) ---------------------------------------

from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from edgespec.core import sampling  # noqa: E402
from edgespec.core.dist import Dense  # noqa: E402
from edgespec.core.sampling import SamplingParams  # noqa: E402

_values = st.one_of(st.floats(-30, 30, width=32), st.sampled_from([0.0, 1.0, 2.5, -np.inf]),
                    st.floats(-0.0009765625, 0.0009765625, width=32))  # (2**-10: near-ties)
_params = st.builds(SamplingParams, temperature=st.sampled_from([0.25, 0.8, 1.0, 3.0]),
                    top_k=st.sampled_from([0, 1, 2, 5, 40]),
                    top_p=st.sampled_from([1.0, 0.99, 0.9, 0.5, 0.1]),
                    min_p=st.sampled_from([0.0, 0.05, 0.5, 1.0]))


def _assert_as_numpys_exp(got, want, args, maxulp):
    """``got`` equals ``want`` bit for bit where NumPy's float64 exp of ``args`` is the C
    library's, which the compiled passes call; else within ``maxulp``. NumPy's float64 exp is
    its own SIMD code where the CPU has AVX-512: on the Sapphire Rapids VMs of 2026-11-28
    (NumPy 2.4.6) it differs from glibc's by 1 ulp in ~5% of arguments."""
    if np.array_equal(np.exp(args), [math.exp(a) for a in args]):
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_array_max_ulp(got, want, maxulp=maxulp)


@needs_rows
@settings(max_examples=800, deadline=None)
@given(st.lists(_values, min_size=1, max_size=300).map(lambda v: np.array(v, np.float32)),
       _params, st.integers(0, 2**32 - 1), st.booleans(), st.booleans())
@example(np.array([1, 1, 0, 0], np.float32), SamplingParams(temperature=1.0, top_p=0.5), 0,
         False, False)  # a cut exactly at a tie: before == top_p * mass
@example(np.zeros(300, np.float32), SamplingParams(temperature=1.0, top_k=40), 0, False, False)
def test_filtered_is_numpys_path_bit_for_bit(row, params, seed, subset, with_total):
    # the compiled filters against _filtered's NumPy arithmetic on the same candidates: the same
    # ids and the same probabilities, bit for bit (a total given with a cut within its margin:
    # -1, NumPy's path decides)
    if not np.any(row > -np.inf):
        return
    rng = np.random.default_rng(seed)
    ids = np.arange(row.size)
    if subset:  # any ascending subset holding the top logit
        ids = np.union1d(rng.choice(row.size, max(1, row.size // 2), replace=False),
                         [int(np.argmax(row))]).astype(np.int64)
    top = float(row[ids].max())
    dense = None
    if with_total:
        dense = sampling._dense(row, top, params.temperature, row.size, precise=True)
    out_ids, out_p = np.empty(ids.size, np.int64), np.empty(ids.size)
    count = ROWS.filtered(row, ids, top, params.temperature, params.top_k, params.top_p,
                          params.min_p, -1.0 if dense is None else dense.total,
                          sampling._TOTAL_ERR, False, out_ids, out_p)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sampling, "_ROWS", None)
        want = sampling._filtered(row, top, ids, params, dense, row.size)
    if count < 0:
        assert dense is not None and params.top_p < 1.0 and not (
            params.top_k and params.top_k < ids.size)
        return
    np.testing.assert_array_equal(out_ids[:count], want.ids)
    # (each weight 1 ulp off at most, and so the total: a probability a few ulp)
    _assert_as_numpys_exp(out_p[:count], want.probs,
                          (row[ids].astype(np.float64) - top) / params.temperature, maxulp=4)


@needs_rows
def test_filtered_refuses_what_it_cannot_take():
    x, ids = np.zeros(8, np.float32), np.arange(8)
    out_ids, out_p = np.empty(8, np.int64), np.empty(8)
    args = (0.0, 1.0, 0, 1.0, 0.0, -1.0, 4e-6, False)
    assert ROWS.filtered(x, ids, *args, out_ids, out_p) == 8
    with pytest.raises(ValueError, match="inside x"):
        ROWS.filtered(x, np.arange(1, 10), *args, np.empty(9, np.int64), np.empty(9))
    with pytest.raises(ValueError):
        ROWS.filtered(x, ids, *args, out_ids[:4], out_p)
    with pytest.raises(TypeError, match="int64"):
        ROWS.filtered(x, ids.astype(np.int32), *args, out_ids, out_p)
    with pytest.raises(TypeError, match="float64"):
        ROWS.filtered(x, ids, *args, out_ids, out_p.astype(np.float32))


# ---- a row's head from its column maxima (`head`) ---------------------------------------------


@needs_rows
@pytest.mark.parametrize("top", [9.0, 13.0, 15.0, 20.0, 30.0])
@pytest.mark.parametrize("t", [0.25, 0.8, 1.0, 2.0])
@pytest.mark.parametrize("n", [151_936, 16_411])  # (the second: a tail past the grid)
def test_head_is_numpys_head(top, t, n):
    # the same head (ids, float64 weights: bit for bit, as NumPy's exp allows) and the same
    # bounds on the total but for the columns' float32 exps (each within 2e-7 of the other's:
    # the bounds move by that)
    rng = np.random.default_rng(int(top * 10 + t * 100))
    row = rng.normal(0.0, 2.0, n).astype(np.float32)
    row[rng.choice(n, 6, replace=False)] = top - np.array([0, 1, 1.8, 2.5, 3, 3.4], np.float32)
    row[n - 3] = top - 0.5  # in the tail where there is one
    maxima = sampling._Maxima.of(row)
    for loose in (False, True):
        got = sampling._head(maxima, float(maxima.top), t, loose=loose)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(sampling, "_ROWS", None)
            want = sampling._head(maxima, float(maxima.top), t, loose=loose)
        assert (got is None) == (want is None), (loose, got, want)
        if got is None:
            continue
        np.testing.assert_array_equal(got[0], want[0])
        _assert_as_numpys_exp(got[1], want[1],
                              (row[got[0]].astype(np.float64) - float(maxima.top)) / t, maxulp=1)
        np.testing.assert_allclose(got[2:], want[2:], rtol=1e-6)
