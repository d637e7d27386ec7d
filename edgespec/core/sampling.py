"""Sampling settings as processed distributions (Leviathan et al. 2023, section 2.2).

Temperature, top-k, top-p, min-p and greedy are all "sample from an adjusted distribution":
``process`` turns raw logits into that distribution, and draft and target always go through the
same ``process`` with the same settings, so the exact rejection test in :mod:`edgespec.core.rejection`
sees the distributions that are really sampled from.

Order of processing (the Hugging Face / vLLM order): temperature, then top-k, then top-p, then
min-p, renormalising once at the end. Greedy (temperature 0) is the one-hot distribution on the
arg-max; ties go to the lowest token id, for draft and target alike.

This module is NumPy, with two fused passes over a whole row compiled where edgespec was built
with them (:mod:`edgespec.core.rowpass`), and otherwise, for whole-row ``exp``, ggml's
vectorised kernel through :mod:`edgespec._native`: it imports nothing from llama_cpp.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np

from .._native import exp_kernel
from ..config import (DEFAULT_MIN_P, DEFAULT_PENALTY_LAST_N, DEFAULT_TEMPERATURE, DEFAULT_TOP_K,
                      DEFAULT_TOP_P)
from ..errors import ConfigError, LogitsError
from .dist import (BLOCK, AnyDist, Dense, OneHot, Pending, Sparse, Truncated,  # noqa: F401
                   block_sums, sample)  # (sample: API)
from .rowpass import rows

#: the compiled row passes (:mod:`edgespec.core.rowpass`), or None: NumPy's
_ROWS = rows()

#: top-p first looks among this many most likely tokens: partitioning is O(V), a full sort of a
#: 152k vocabulary is not. If the nucleus is larger, it falls back to the full sort (same result).
_TOP_P_CANDIDATES = 1024


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are sampled. ``temperature=0`` is greedy decoding.

    ``top_k=0``, ``top_p=1.0`` and ``min_p=0.0`` disable those filters. ``seed`` makes a run
    reproducible (the same seed and settings give the same text); ``None`` draws fresh entropy.

    The logits are first shaped per position (:mod:`edgespec.core.penalties`, llama.cpp's
    order and meaning): ``logit_bias`` (token id -> added logit, OpenAI's -100..100),
    ``repeat_penalty`` (llama.cpp's: a positive logit divided by it, a negative one
    multiplied; 1 = off), ``frequency_penalty`` and ``presence_penalty`` (OpenAI's, -2..2: minus
    the count, and minus once, of each token among the last ``penalty_last_n`` tokens of the
    context; -1 = the whole context, 0 = none).
    """

    temperature: float = DEFAULT_TEMPERATURE
    top_k: int = DEFAULT_TOP_K
    top_p: float = DEFAULT_TOP_P
    min_p: float = DEFAULT_MIN_P
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_penalty: float = 1.0
    penalty_last_n: int = DEFAULT_PENALTY_LAST_N
    #: (token id, bias) pairs, sorted by id (a dict is accepted and converted)
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        _check_shaping(self)
        t = self.temperature
        if not isinstance(t, (int, float)) or math.isnan(t) or t < 0 or math.isinf(t):
            raise ConfigError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ConfigError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        p = self.top_p
        if not isinstance(p, (int, float)) or math.isnan(p) or not 0 < p <= 1:
            raise ConfigError(f"top_p must be in (0, 1] (1 = off), got {p!r}")
        m = self.min_p
        if not isinstance(m, (int, float)) or math.isnan(m) or not 0 <= m <= 1:
            raise ConfigError(f"min_p must be in [0, 1] (0 = off), got {m!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise ConfigError(f"seed must be an integer >= 0, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        """True when sampling is the arg-max (temperature 0)."""
        return self.temperature == 0

    @property
    def shaped(self) -> bool:
        """True when rows are shaped before processing (a bias or a penalty is on)."""
        return bool(self.logit_bias) or (self.penalty_last_n != 0 and (
            self.presence_penalty != 0 or self.frequency_penalty != 0
            or self.repeat_penalty != 1))


def _number(value, name: str, lo: float, hi: float, what: str) -> None:
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value)
            or not lo <= value <= hi):
        raise ConfigError(f"{name} must be {what}, got {value!r}")


def _check_shaping(params: "SamplingParams") -> None:
    """SamplingParams' shaping fields checked, ``logit_bias`` made a sorted tuple."""
    _number(params.presence_penalty, "presence_penalty", -2, 2, "in [-2, 2] (0 = off)")
    _number(params.frequency_penalty, "frequency_penalty", -2, 2, "in [-2, 2] (0 = off)")
    r = params.repeat_penalty
    if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 < r < math.inf:
        raise ConfigError(f"repeat_penalty must be a number > 0 (1 = off), got {r!r}")
    n = params.penalty_last_n
    if isinstance(n, bool) or not isinstance(n, int) or n < -1:
        raise ConfigError(f"penalty_last_n must be an integer >= -1 (-1 = the whole context, "
                          f"0 = off), got {n!r}")
    bias = params.logit_bias
    items = bias.items() if isinstance(bias, dict) else bias
    try:
        pairs = sorted((_token_id(t), float(b)) for t, b in items)
    except (TypeError, ValueError):
        raise ConfigError(f"logit_bias must map token ids to numbers, got {bias!r}") from None
    for t, b in pairs:
        _number(b, f"logit_bias[{t}]", -100, 100, "in [-100, 100]")
    if len({t for t, _ in pairs}) != len(pairs):
        raise ConfigError("logit_bias names a token twice")
    object.__setattr__(params, "logit_bias", tuple(pairs))


def _token_id(token) -> int:
    """A token id from an int or a decimal string (JSON objects' keys are strings)."""
    if isinstance(token, bool):
        raise ValueError(token)
    value = int(token)
    if value < 0 or (isinstance(token, str) and not token.strip().isdigit()):
        raise ValueError(token)
    return value


def make_rng(seed: int | None) -> np.random.Generator:
    """The engine's one random generator; seeded runs are reproducible."""
    return np.random.default_rng(seed)


#: A candidate set larger than this (a flat row) is not worth cutting: the dense path is used.
_MAX_CANDIDATES = 8192


def distribution(logits: np.ndarray, params: SamplingParams, n_vocab: int | None = None) -> AnyDist:
    """The processed distribution of one row of logits, in its cheapest exact form.

    Same distribution as :func:`process` (the dense reference; the tests compare them), but
    greedy is one ``argmax``, truncating modes cut a small candidate set by a logit threshold
    before any ``exp``, sort or ``cumsum``, and plain temperature computes float32 weights in
    one pass. ``n_vocab``: the vocabulary the distribution is over, if the row is shorter
    (a draft model's logits; ids past the row get probability 0). The result does not keep a
    reference to ``logits``.
    """
    x = logits
    if x.ndim != 1:
        raise ValueError(f"distribution() takes one row of logits, got shape {x.shape}")
    n = n_vocab or x.size
    if params.greedy:
        i = int(np.argmax(x))  # the first NaN if there is one
        top = float(x[i])
    else:
        k = params.top_k if 0 < params.top_k < x.size else 0
        # (compiled: the max and top-k's candidates in one read)
        listed = _largest(x, k, params.temperature) if k else None
        if listed is not None:
            top, largest, maxima = listed[0], listed[1], None
        else:
            # max, not argmax: NumPy's argmax copies a read-only array first, and llama.cpp's
            # rows are read-only views of its buffer (a copy would cost one more pass)
            maxima = (_Maxima.of(x) if (0 < params.top_k or params.min_p > 0.0
                                        or params.top_p < 1.0) else None)
            top, largest = _row_max(x, maxima), None  # NaN if there is one
    if top != top or top == np.inf:  # NaN (raises) or +inf logits: the reference handles it
        return _from_dense(process(x, params))
    if top == -np.inf:
        raise LogitsError("every logit is -inf: no token can be sampled")
    if params.greedy:
        return OneHot(i, n)
    t = params.temperature
    if k:
        ids = largest if largest is not None else _top_ids(x, k, t, maxima)
    elif params.top_p < 1.0:
        return _nucleus(x, top, params, n, maxima)
    elif params.min_p > 0.0:
        ids = _at_least(x, _min_p_floor(top, params), maxima)
    else:
        return _dense(x, top, t, n)
    return _filtered(x, top, ids, params, None, n)


#: a draft's window also leaves out every token that weighs less than this fraction of its top
#: one (see :func:`window_floor`)
WINDOW_RATIO = 1e-4


def window_floor(top: float, t: float) -> np.float32:
    """The lowest logit a draft's window keeps (row max ``top``, temperature ``t``): a weight
    of :data:`WINDOW_RATIO` of the top token's, as a float32 (the logits' own type: one
    comparison for every path)."""
    return np.float32(top + t * math.log(WINDOW_RATIO))


def draft_distribution(logits: np.ndarray, params: SamplingParams, n_vocab: int | None = None,
                       window: int = 0) -> AnyDist:
    """A draft model's proposal distribution ``q``: :func:`distribution` of the row with every
    logit outside its window set to ``-inf``. The window is the row's ``window`` largest
    logits (all logits tied with the ``window``-th stay in) that are at least
    :func:`window_floor`: no token weighing under 1e-4 of the top one. ``window=0``, or one at
    least the row's length: the row as it is.

    Why a draft may do this: the rejection test is exact for any ``q`` that the draft really
    sampled from (Leviathan et al. 2023, section 2.3; Chen et al. 2023, theorem 1), and its
    acceptance rate is ``sum(min(p, q))``, which the window lowers by at most the mass ``q``
    had outside it. A draft's few most likely tokens hold nearly all of it (the default pair
    at T 0.8: a median of 4 tokens above the floor; mean acceptance over 560 positions 0.8678
    with this window, 0.8677 with 64 tokens, 0.8676 with the whole row), and finding them is
    one pass over the row that reads the few columns reaching the floor, instead of an
    ``exp`` of the whole row (plain temperature), of a flat nucleus (top-p) or of every token
    above min-p's floor.
    Top-k at most ``window`` keeps the same tokens either way. The target is never windowed.
    """
    x = logits
    if params.greedy or not 0 < window < x.size or x.ndim != 1 or (
            0 < params.top_k <= window):
        return distribution(x, params, n_vocab)
    offset = params.temperature * math.log(WINDOW_RATIO)
    # (top-p's total counts what min-p drops: min-p narrows the window only without top-p)
    min_p = params.min_p > 0.0 and params.top_p >= 1.0
    if _ROWS is not None and _floats(x) and window + _WINDOW_SLACK <= _WINDOW_MAX:
        # compiled: the max and the window in one read, floor and cut as below
        ids = np.empty(window + _WINDOW_SLACK, np.int64)
        top, count = _ROWS.window(x, offset, _min_p_offset(params) if min_p else -math.inf,
                                  window, ids)
        if count >= 0:  # (-1: ties at the window's edge filled the pass's list)
            if top != top or top == np.inf or top == -np.inf:  # NaN, +inf, all -inf
                return distribution(x, params, n_vocab)
            return _filtered(x, top, ids[:count], params, None, n_vocab or x.size,
                             floored=True)
    maxima = _Maxima.of(x)
    top = _row_max(x, maxima)
    if top != top or top == np.inf or top == -np.inf:  # NaN, +inf, all -inf: as distribution()
        return distribution(x, params, n_vocab)
    floor = float(window_floor(top, params.temperature))
    if min_p:
        floor = max(floor, _min_p_floor(top, params))
    found = maxima.at_least(floor, window) if maxima is not None else None
    if found is None:  # many columns reach the floor: the window's largest logits first
        found = _top_ids(x, window, params.temperature, maxima)
        found = found[x[found] >= np.float32(floor)]
    if found.size > window:
        values = x[found]
        found = found[values >= np.partition(values, found.size - window)[found.size - window]]
    return _filtered(x, top, found, params, None, n_vocab or x.size, floored=True)


#: the compiled window pass lists a draft row's candidates in the window's size plus this many
#: slots (a step of the pass adds up to 128; when they fill, it keeps the window's largest
#: listed, raising its floor: fewer slots raise it sooner, measured fastest at 192), and in
#: at most this many in all
_WINDOW_SLACK = 192
_WINDOW_MAX = 4096


def _largest(x: np.ndarray, k: int, t: float) -> tuple[float, np.ndarray | None] | None:
    """The row's max (NaN if it holds one) and, from the compiled pass, the ids (ascending)
    of its k largest logits and every logit whose weight at temperature ``t`` can round onto
    the k-th's (:meth:`_Maxima.top_ids`'s set, cut in the same call by :func:`_tie_floor`'s
    arithmetic): ``(top, ids)``, or ``(top, None)`` where the pass's list may miss some of
    those (ties filling it, or subnormal weights); ``None`` where the pass is not built or
    does not take ``x``."""
    if _ROWS is None or not _floats(x) or k + _WINDOW_SLACK > _WINDOW_MAX:
        return None
    ids = np.empty(k + _WINDOW_SLACK, np.int64)
    top, count, _ = _ROWS.largest(x, k, ids, t)
    if count == -1:  # (the max is moot there: ties filled the list before its end)
        return float(np.max(x)), None
    return top, (ids[:count] if count >= 0 else None)


def _tie_floor(kth: float, top: float, t: float) -> float | None:
    """A logit below which no weight at temperature ``t`` can round onto that of ``kth`` (a
    k-th largest logit, or a bound below it): ``None`` where weights are subnormal and tie
    over wide ranges of logits."""
    if (kth - top) / t < -700.0:
        return None
    # (float64's (x - top) / t and exp merge logits ~1e-15 apart, relative to these)
    return kth - 1e-9 * (t + abs(kth) + abs(top))


def _ids_at_least(x: np.ndarray, floor: float, cap: int) -> np.ndarray | None:
    """Ids (ascending) of the logits ``>= floor`` (as a float32), from the compiled pass:
    ``None`` where it is not built or does not take ``x``, or where more than ``cap`` logits
    reach the floor (the pass stops there)."""
    if _ROWS is None or not _floats(x):
        return None
    ids = np.empty(cap, np.int64)
    count = _ROWS.at_least(x, floor, ids)
    return ids[:count] if count <= cap else None


def top_window(rows: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's ``window`` largest logits and their ids (int32 and float32, shape
    ``(rows, window)``, in no order; ``window`` at most the row's length): a draft's window as
    :func:`window_distribution` takes it."""
    ids = np.argpartition(rows, rows.shape[1] - window, axis=1)[:, rows.shape[1] - window:]
    return ids.astype(np.int32), np.take_along_axis(rows, ids, axis=1)


def window_distribution(ids: np.ndarray, logits: np.ndarray, params: SamplingParams,
                        n_vocab: int) -> AnyDist:
    """A draft's proposal distribution from a window a backend took (``ids`` in any order,
    their ``logits``): :func:`distribution` of a row whose every other logit is ``-inf``, and
    whose logits below :func:`window_floor` are too. Ids at or past ``n_vocab`` (a draft's
    padding) are left out. Equal to
    :func:`draft_distribution` when the window holds the row's largest logits (only a tie at
    its edge can make a backend's window another one, and any window is exact)."""
    order = ids.argsort()  # (a window's ids are distinct: any sort gives the same order)
    ids, x = ids[order], logits[order]
    if ids.size and ids[-1] >= n_vocab:
        end = int(ids.searchsorted(n_vocab))
        ids, x = ids[:end], x[:end]
    ids = ids.astype(np.int64)
    if x.dtype != np.float32:
        x = x.astype(np.float32)
    if ids.size == 0:
        raise LogitsError("the draft's window holds no token of the target's vocabulary")
    # over positions 0..size-1 (ascending ids: ties go to the lowest id), as draft_distribution
    top = float(x.max())
    if params.greedy or not math.isfinite(top):  # (NaN raises, +inf as the reference says)
        d = distribution(x, params)
    elif 0 < params.top_k <= x.size:  # (top-k within the window: no floor, as the host's)
        d = _filtered(x, top, np.arange(x.size), params, None, x.size)
    else:
        inside = (x >= window_floor(top, params.temperature)).nonzero()[0]
        d = _filtered(x, top, inside, params, None, x.size, floored=True)
    if isinstance(d, OneHot):
        return OneHot(int(ids[d.token]), n_vocab)
    return Sparse(ids[d.ids], d.probs, n_vocab)


#: a row's head: the columns whose maximum weighs at least exp(this) (the top token weighs 1)
_HEAD_LOG = math.log(1e-4)
#: more head columns than this: a flat row (most of its weight in a bulk of small logits)
_MAX_HEAD = 64
#: bounds on a row's total weight from its head (:func:`_head`) are used while they are this
#: close (their ratio); a flatter row's bulk, which the column maxima only bound 64-fold, is
#: summed instead
_HEAD_RATIO = 1.05
#: relative margin of those bounds for the float32 arithmetic of the row's Dense form: its
#: weights (the exponent's rounding grows with its size: the second term, per unit of it)
#: and its total (see _TOTAL_ERR)
_HEAD_EPS = 3e-5
_HEAD_EPS_ARG = 3e-7


def _head(maxima: "_Maxima", top: float, t: float, listed: bool = True, loose: bool = False
          ) -> tuple[np.ndarray | None, np.ndarray | None, float, float] | None:
    """A confident row's head and bounds on its total weight, with no pass over the row
    beyond its maxima: ``(ids, w, lo, hi)``, the ids (ascending) of every logit that weighs
    at least exp(:data:`_HEAD_LOG`) and their float64 weights ``exp((x - top) / T)``, and
    ``lo <= Z <= hi`` for the row's total ``Z`` (within :data:`_HEAD_EPS` of the Dense form's
    total too). ``None`` for a flat row, or where the bounds are not within
    :data:`_HEAD_RATIO` of each other. ``listed=False``: the bounds only (ids and weights
    ``None``), for a caller that never reads them. ``loose``: the head and its bounds however
    far apart they are (``None`` only for a flat row).

    ``Z`` is the exact weight of the columns whose maximum reaches the head (all 64 logits of
    each) plus, for every other column, between one and 64 times its maximum's weight.
    """
    cols = maxima.cols
    floor = np.float32(top + t * _HEAD_LOG)
    listing = None
    if _ROWS is not None and _floats(maxima.x) and _floats(cols):
        # compiled: the same sums and the listing in one call
        cap = _SLICES * (_MAX_HEAD + 1)
        ids, w = np.empty(cap, np.int64), np.empty(cap)
        count, _, rest, exact = _ROWS.head(maxima.x, cols, _SLICES, top, t, floor, _MAX_HEAD,
                                           0.0 if loose else _HEAD_RATIO, ids, w)
        if count < 0:  # (a flat row, or the guess below)
            return None
        listing = ids[:count], w[:count]
    else:
        sums = _head_sums(maxima, top, t, floor, loose)
        if sums is None:
            return None
        rest, exact, list_head = sums
    lo = (exact + rest * (1.0 - 2e-5)) * (1.0 - _HEAD_EPS)
    hi = (exact + _SLICES * rest * (1.0 + 2e-5) + 1e-30) * (1.0 + _HEAD_EPS)
    if hi > _HEAD_RATIO * lo and not loose:
        return None
    if not listed:
        return None, None, lo, hi
    ids, w = listing if listing is not None else list_head()
    return ids, w, lo, hi


def _head_sums(maxima: "_Maxima", top: float, t: float, floor: np.float32, loose: bool):
    """:func:`_head`'s sums in NumPy: ``(rest, exact, list_head)`` (the weight of the columns
    outside the head by their maxima, that of every logit of the head's columns and of the
    tail, and a function that lists the head: ids ascending and float64 weights), or
    ``None`` for a flat row (or where the guess says the bounds are loose)."""
    cols = maxima.cols
    head = (cols >= floor).nonzero()[0]
    if head.size > _MAX_HEAD:
        return None
    with np.errstate(under="ignore"):
        # every column's maximum weighed in float32 (relative error < 2e-5 for any weight
        # that float32 holds; a smaller one adds < 1e-33 in all): only the columns outside
        # the head count, and only in the bounds
        e = cols - np.float32(top)
        e *= np.float32(1.0 / t)
        np.exp(e, out=e)
        e = e.astype(np.float64)  # (once: two float64 sums of a float32 array cast twice)
        maxima_weight = float(e[head].sum())
        rest = max(float(e.sum()) - maxima_weight, 0.0)
        # a guess before the head is read: its weight is mostly its columns' maxima (a
        # wrong guess costs time, never exactness)
        if not loose and (maxima_weight + _SLICES * rest) > _HEAD_RATIO * (maxima_weight + rest):
            return None
        values = maxima.grid[:, head]
        weights = _scaled_exp(values, top, t)
        exact = float(weights.sum())
        tail = maxima.tail
        if tail.size:  # (the default vocabulary has none: 64 x 2,374)
            tw = _scaled_exp(tail, top, t)
            exact += float(tw.sum())

    def list_head() -> tuple[np.ndarray, np.ndarray]:
        rows, at = (values >= floor).nonzero()
        ids, w = rows * cols.size + head[at], weights[rows, at]
        if tail.size:
            more = (tail >= floor).nonzero()[0]
            ids = np.concatenate([ids, more + maxima.grid.size])
            w = np.concatenate([w, tw[more]])
        order = ids.argsort()
        return ids[order], w[order]

    return rest, exact, list_head


def pending_distribution(x: np.ndarray, params: SamplingParams,
                         n_vocab: int | None = None) -> AnyDist:
    """:func:`distribution`, except that a plain-temperature row whose total weight its head
    bounds tightly (:func:`_head`) is a :class:`Pending`: bounds on each ``p(x)`` with no
    ``exp`` of the whole row, which the rejection test usually decides from. Resolved, it is
    exactly what :func:`distribution` gives. Unlike that, it keeps a reference to ``x``: for a
    target row verified before the next decode overwrites it.
    """
    if (params.greedy or params.top_k or params.top_p < 1.0 or params.min_p > 0.0
            or x.ndim != 1):
        return distribution(x, params, n_vocab)
    maxima = _Maxima.of(x)
    if maxima is None or not math.isfinite(maxima.top):
        return distribution(x, params, n_vocab)
    top, t, n = maxima.top, params.temperature, n_vocab or x.size
    head = _head(maxima, top, t, listed=False)
    if head is None:
        return _dense(x, top, t, n)
    lo, hi = head[2:]

    def bounds(y: int) -> tuple[float, float]:
        if y >= x.size:
            return 0.0, 0.0
        arg = (float(x[y]) - top) / t
        if arg < -80.0:  # float32's weight is subnormal or 0 there: only an upper bound
            return 0.0, min((math.exp(max(arg, -700.0)) + 1e-44) / lo, 1.0)
        w, slack = math.exp(arg), _HEAD_EPS - _HEAD_EPS_ARG * arg
        return w * (1.0 - slack) / hi, min(w * (1.0 + slack) / lo, 1.0)

    return Pending(n, bounds, lambda: _dense(x, top, t, n))


#: a long row is read as this many slices of consecutive ids laid side by side (a column is the
#: ids that are equal mod the row's length // _SLICES)
_SLICES = 64
#: rows with fewer columns than this take the plain passes (``max``, then a threshold over all)
_MIN_COLUMNS = 256


class _Maxima:
    """A row's column maxima (:data:`_SLICES` slices side by side): one pass over the row that
    gives its max and, for a threshold, the few columns that can hold a logit above it.

    Why: a threshold pass over the whole row (a compare, then NumPy's ``nonzero`` on 152k
    booleans: ~50 µs) costs more than the elementwise max of 64 slices (~20 µs, and it is the
    ``max`` the row needs anyway); the ids above a high threshold are then found among the
    columns whose maximum reaches it (~k of ~2,400 columns for the k most likely tokens).
    """

    __slots__ = ("x", "grid", "cols", "tail", "top")

    def __init__(self, x: np.ndarray, width: int) -> None:
        self.x = x
        self.grid = x[: _SLICES * width].reshape(_SLICES, width)
        self.cols = self.grid.max(axis=0)
        self.tail = x[_SLICES * width:]  # (fewer than _SLICES ids past the grid)
        top = self.cols.max()
        if self.tail.size:
            top = np.maximum(top, self.tail.max())  # (a NaN anywhere stays NaN)
        self.top = float(top)

    @classmethod
    def of(cls, x: np.ndarray) -> "_Maxima | None":
        """The maxima of a long 1-D row, ``None`` for a short one (or a strided view)."""
        width = x.size // _SLICES
        if x.ndim != 1 or width < _MIN_COLUMNS or not x.flags.c_contiguous:
            return None
        return cls(x, width)

    def at_least(self, floor: float, limit: int = 0) -> np.ndarray | None:
        """Ids (ascending) of the logits ``>= floor`` (``None`` if more than ``limit``
        columns hold some, where ``limit`` is given)."""
        floor = np.float32(floor) if np.isfinite(floor) else floor
        cols = (self.cols >= floor).nonzero()[0]
        if limit and cols.size > limit:
            return None
        if cols.size * 8 > self.cols.size:  # a low floor: one pass over the row is cheaper
            return (self.x >= floor).nonzero()[0]
        rows, at = (self.grid[:, cols] >= floor).nonzero()
        ids = rows * self.cols.size + cols[at]
        if self.tail.size:
            ids = np.concatenate([ids, (self.tail >= floor).nonzero()[0] + self.grid.size])
        ids.sort()
        return ids

    def top_ids(self, k: int, t: float) -> np.ndarray:
        """Ids (ascending) of a superset of the ``k`` largest logits, with every logit whose
        weight at temperature ``t`` can round onto the k-th's: those at or above the k-th
        largest column maximum (at least k logits reach it, one in each of those columns, so
        the k-th largest logit does), less a margin for float64's rounding of the weights."""
        if k > self.cols.size:
            return _top_candidates(self.x, k)[0]
        kth = float(np.partition(self.cols, self.cols.size - k)[self.cols.size - k])
        floor = _tie_floor(kth, self.top, t)
        return _top_candidates(self.x, k)[0] if floor is None else self.at_least(floor)


def _row_max(x: np.ndarray, maxima: _Maxima | None) -> float:
    """The row's largest logit (NaN if it has one), from its maxima if made."""
    return float(x.max()) if maxima is None else maxima.top


def _min_p_floor(top: float, params: SamplingParams) -> float:
    """A logit below which min-p keeps no token (1e-6 lower: the filter itself decides the
    tokens at its edge)."""
    return top + _min_p_offset(params)


def _min_p_offset(params: SamplingParams) -> float:
    """:func:`_min_p_floor` less the row's max."""
    return params.temperature * (np.log(params.min_p) - 1e-6)


def _at_least(x: np.ndarray, floor: float, maxima: _Maxima | None) -> np.ndarray:
    """Ids (ascending) of the logits ``>= floor``, through the row's maxima if made."""
    return (x >= floor).nonzero()[0] if maxima is None else maxima.at_least(floor)


def _top_ids(x: np.ndarray, k: int, t: float, maxima: _Maxima | None) -> np.ndarray:
    """Ids (ascending) of a superset of the k largest logits, every tie with the k-th in."""
    return _top_candidates(x, k)[0] if maxima is None else maxima.top_ids(k, t)


def _top_candidates(x: np.ndarray, k: int, top: float | None = None,
                    t: float = 1.0) -> tuple[np.ndarray, float]:
    """Ids of a superset of the k largest logits (all ids tied with the k-th included), and a
    floor every other logit is below (``-inf`` when the ids are the whole row).

    The threshold is guessed from a strided sample of the row (its value of rank ~4k + 16 when
    scaled up), then checked: at least k ids at or above it, else a guess 4x deeper in the
    sample, and the whole row only when the sample runs out. With ``top`` (the row's largest
    logit) and ``t``, the ids also take every logit whose weight at temperature ``t`` could
    round onto the threshold's (:func:`_tie_floor`): a tie in weight that reaches below the
    threshold's logit must not be cut by it (a logit of -1e-45 weighs what 0 does).
    """
    stride = max(1, x.size // 4096)
    sample_ = x[::stride]
    rank = -(-(4 * k + 16) // stride)
    part = None
    while rank < sample_.size:
        # (k = 40 in a 152k row is rank 5 of the sample: the count above it is ~Gamma(5, 37),
        # under 40 for ~0.5% of rows, and the whole row's sort then costs ~18 ms)
        if part is None:
            part = sample_.copy()  # (array methods: NumPy's function wrappers cost µs a call)
        part.partition(sample_.size - rank)
        guess = float(part[sample_.size - rank])
        tied = _tie_floor(guess, top, t) if top is not None else None
        if tied is not None:
            guess = tied
        # (the rank scaled up: the ids expected at or above the guess; 4x that, a margin)
        ids = _ids_at_least(x, guess, 4 * rank * stride)
        if ids is None:
            ids = (x >= np.float32(guess)).nonzero()[0]
        if ids.size >= k:
            return ids, guess
        rank *= 4
    return np.arange(x.size), -math.inf


def _scaled_exp(values: np.ndarray, top: float, t: float) -> np.ndarray:
    """float64 weights exp((values - top) / T), computed in one new array (the caller sets
    NumPy's error state for underflow)."""
    v = values.astype(np.float64)
    v -= top
    v /= t
    return np.exp(v, out=v)


def _weights(x: np.ndarray, ids: np.ndarray, top: float, t: float,
             floored: bool = False) -> np.ndarray:
    """float64 weights exp((x - top) / T) of the logits at ``ids``. ``floored``: none of them
    can underflow (they are above a window's floor), so NumPy's error state is left alone
    (setting it costs more than the exp of a window)."""
    if floored:
        return _scaled_exp(x[ids], top, t)
    with np.errstate(under="ignore"):
        return _scaled_exp(x[ids], top, t)


#: top-p orders the head of its candidates first (see :func:`_descending_order`)
_ORDER_HEAD = 64
#: from this many candidates on, :func:`_descending_order` sorts one integer key instead of
#: calling ``lexsort`` (two keys), whose cost grows faster: ~2x cheaper at 2,000, ~3x at 4,000;
#: below, the key's few extra NumPy calls cost more than they save
_KEY_SORT_FROM = 1500


def _descending_order(x: np.ndarray, ids: np.ndarray, w: np.ndarray,
                      head: int = 0) -> np.ndarray:
    """Positions of the candidates ``ids`` (ascending; float64 weights ``w`` of the logits
    ``x[ids]``) by descending weight, ties: lowest id first.

    ``head``: only the first ``head`` or more positions of that order (every candidate tied
    with the last of them included) where the candidates are many more: a confident row's
    nucleus is a few tokens of ~1,000 candidates, and a partition finds them for a fraction
    of a sort. A caller whose cut reaches the end of a shorter order asks for the whole.
    """
    if head and ids.size > 4 * head:
        heaviest = (w >= np.partition(w, w.size - head)[w.size - head]).nonzero()[0]
        return heaviest[_descending_order(x, ids[heaviest], w[heaviest])]
    if ids.size < _KEY_SORT_FROM:
        return np.lexsort((ids, -w))
    # One int64 per candidate: the logit's float32 bits made to order like integers
    # (descending) above, its position (so its id: ids ascend) below.
    b = x[ids] + np.float32(0.0)  # (-0.0 becomes 0.0: the two are one logit)
    b = b.view(np.int32)
    b ^= (b >> 31) & 0x7FFFFFFF
    key = (~b).astype(np.int64)
    key <<= 32
    key |= np.arange(ids.size)
    key.sort()
    order = key & 0xFFFFFFFF
    # The weights follow the logits' order, unless float64's exp rounded two different logits
    # onto one weight (the tie then belongs to the lower id) or was not monotone: lexsort.
    ws = w[order]
    if (ws[1:] > ws[:-1]).any():
        return np.lexsort((ids, -w))
    tied = ws[1:] == ws[:-1]
    if tied.any() and (order[1:][tied] < order[:-1][tied]).any():
        return np.lexsort((ids, -w))
    return order


def _filtered(x: np.ndarray, top: float, ids: np.ndarray, params: SamplingParams,
              dense: Dense | None, n: int, w: np.ndarray | None = None,
              order: np.ndarray | None = None, floored: bool = False) -> AnyDist:
    """Apply top-k, top-p and min-p to the candidates ``ids`` (ascending, a superset of every
    token the filters can keep); ``dense``: the whole row's weights when top-p needs their
    total and top-k does not bound the set first; ``w``: the candidates' weights, if known,
    and ``order`` their :func:`_descending_order`, if known. ``floored``: every candidate is
    at or above a draft window's floor (weights of 1e-4 or more: none is 0)."""
    if (_ROWS is not None and 0 < ids.size <= _FILTER_MAX and ids.dtype == np.int64
            and ids.flags.c_contiguous and _floats(x)):
        # compiled: the same arithmetic in one call (``w`` and ``order``, where given, are
        # what it computes again: the weights by the same formula, the order in full)
        out_ids, out_probs = np.empty(ids.size, np.int64), np.empty(ids.size)
        count = _ROWS.filtered(x, ids, top, params.temperature, params.top_k, params.top_p,
                               params.min_p, -1.0 if dense is None else dense.total,
                               _TOTAL_ERR, floored, out_ids, out_probs)
        if count > 0:  # (else a cut too near the total's rounding: decided below)
            return Sparse(out_ids[:count], out_probs[:count], n)
    if w is None:
        w = _weights(x, ids, top, params.temperature, floored)
    if params.top_k and params.top_k < ids.size or params.top_p < 1.0:
        if order is None:
            order = _descending_order(x, ids, w)
        if params.top_k and params.top_k < ids.size:
            order = order[: params.top_k]
            dense = None
        if params.top_p < 1.0:
            ws = w[order]
            cum = ws.cumsum()
            before = cum - ws
            mass = cum[-1] if dense is None else dense.total
            if dense is not None and np.any(
                    np.abs(before - params.top_p * mass) <= _TOTAL_ERR * mass):
                mass = _precise_total(dense, ids, w)
            kept = before < params.top_p * mass
            if dense is not None and order.size < ids.size and kept.all():
                # (the head of the order given holds no cut: the whole order)
                return _filtered(x, top, ids, params, dense, n, w)
            order = order[kept]
        keep = np.sort(order)
        ids, w = ids[keep], w[keep]
    if params.min_p > 0.0:
        cut = w >= params.min_p * w.max()
        if not floored:
            cut &= w > 0.0
        ids, w = ids[cut], w[cut]
    elif not floored:
        cut = w > 0.0  # -inf logits (or weights below float64's range) were never candidates
        if np.count_nonzero(cut) < cut.size:
            ids, w = ids[cut], w[cut]
    return Sparse(ids, w / w.sum(), n)


#: candidate sets up to this size are filtered by the compiled pass where it is built (its
#: limit)
_FILTER_MAX = 4096

#: how far (relative) a Dense total can be from the float64 one: float32 weights, and ggml's
#: kernel sums each SIMD register's lanes in float32 before it accumulates in double
_TOTAL_ERR = 4e-6


def _precise_total(dense: Dense, ids: np.ndarray, w: np.ndarray) -> float:
    """The row's total weight with the candidates' float64 weights ``w`` (at ``ids``) and the
    rest summed in float64 from the float32 weights: rounding left only on the rest.

    For a top-p cut that falls within :data:`_TOTAL_ERR` of a candidate's mass (ties at the
    cut: two equal tokens and top_p 0.5): there the float32 total would decide a different
    support than the definition's float64 one.
    """
    rest = float(dense.w.sum(dtype=np.float64)) - float(dense.w[ids].sum(dtype=np.float64))
    return float(w.sum()) + max(rest, 0.0)


#: a wide head's tokens (those above the head's weight) are listed from up to this many
#: columns, for a nucleus they may hold
_WIDE_HEAD = 256

#: top-p on a wide row first looks for its nucleus among (a superset of) this many most
#: likely tokens: a confident row's nucleus is there even when its tail is long
_NUCLEUS_GUESS = 256
#: a float32 weight's bits shifted right by this are its bin: 8 bins per octave of weight
_BIN_SHIFT = 20
#: the margin for a top-p cut against a total summed in float32: a cut that close to the
#: threshold (1e-6 of the mass) may go either way
_MARGIN = 1e-6


def _nucleus(x: np.ndarray, top: float, params: SamplingParams, n: int,
             maxima: _Maxima | None = None) -> AnyDist:
    """top-p without top-k: the normaliser is the whole row's weight (``maxima``: the row's
    :class:`_Maxima`, if made)."""
    t = params.temperature
    if maxima is not None and params.min_p <= 0.0:
        # a confident row: its head holds the nucleus, and bounds on the total from the
        # column maxima usually place the cut with no pass over the row; where they are loose
        # (a bulk of light tokens whose weight moves the cut) the exact total does, from one
        # pass
        head = _head(maxima, top, t, loose=True)
        if head is not None:
            ids, w, lo, hi = head
            if hi <= _HEAD_RATIO * lo:
                found = _bounded(x, top, params, ids, w, top + t * _HEAD_LOG, False, n,
                                 high=params.top_p * hi)
                if found is not None:
                    return found
            d = _dense(x, top, t, n, precise=True)
            if w.sum() >= params.top_p * d.total * (1 + _TOTAL_ERR):
                # the nucleus is a prefix of the head's order (every token above a weight)
                return _filtered(x, top, ids, params, d, n, w)
            return _flat_nucleus(x, d, top, params, n)
        # A wide head (more columns reach the head's weight than it lists): the search for
        # candidates below never placed such a row's cut (none of the generated pool's 43
        # such rows of 97, nor the default pair's 6), and its sample costs most of an exact
        # pass. That pass, then the tokens above the head's weight where they hold the
        # nucleus, else the flat row's.
        d = _dense(x, top, t, n, precise=True)
        ids = maxima.at_least(top + t * _HEAD_LOG, _WIDE_HEAD) if _WIDE_HEAD else None
        if ids is not None and ids.size <= _FILTER_MAX:
            w = _weights(x, ids, top, t)
            if w.sum() >= params.top_p * d.total * (1 + _TOTAL_ERR):
                return _filtered(x, top, ids, params, d, n, w)
        return _flat_nucleus(x, d, top, params, n)
    ids, w, order = None, None, None  # candidates whose weights (and order) were computed
    minp_ids = None
    if params.min_p > 0.0:
        # min-p keeps a prefix of the same descending order as top-p: the shorter prefix wins,
        # and the min-p bound holds it
        floor = _min_p_floor(top, params)
        minp_ids = _at_least(x, floor, maxima)
        if minp_ids.size <= _MAX_CANDIDATES:
            ids, w = minp_ids, _weights(x, minp_ids, top, t)
            found = _bounded(x, top, params, ids, w, floor, True, n)
            if found is not None:
                return found
    # (with min-p, its support's bound was tried: if it did not decide, the row is flat enough
    # that a wider candidate set rarely does)
    cands = None
    if minp_ids is None or minp_ids.size > _MAX_CANDIDATES:
        cands = _top_candidates(x, _NUCLEUS_GUESS, top, t)
    if cands is not None:
        ids, floor = cands
        if ids.size < x.size or ids.size <= _MAX_CANDIDATES:  # (a short row: all candidates)
            w = _weights(x, ids, top, t)
            high = _high(x, top, params, ids, w, floor)
            if ids.size == x.size or high < float(w.sum()):
                # not flat: the order is worth computing, and serves _filtered too if the
                # candidates alone do not decide
                order = _descending_order(x, ids, w, _ORDER_HEAD)
                found = _bounded(x, top, params, ids, w, floor, False, n, order, high)
                if found is not None:
                    return found
    # The cut depends on the weight outside the candidates: one float32 pass gives every
    # weight and the total.
    d = _dense(x, top, t, n, precise=True)
    if minp_ids is not None:
        return _filtered(x, top, minp_ids, params, d, n, w if ids is minp_ids else None)
    if w is not None and w.sum() >= params.top_p * d.total * (1 + _TOTAL_ERR):
        # the nucleus is a prefix of these, usually of their few heaviest: their order first
        # (_filtered orders them all only if the cut lies past those)
        if order is None:
            order = _descending_order(x, ids, w, _ORDER_HEAD)
        return _filtered(x, top, ids, params, d, n, w, order)
    return _flat_nucleus(x, d, top, params, n)


def _flat_nucleus(x: np.ndarray, d: Dense, top: float, params: SamplingParams,
                  n: int) -> Dense | Truncated:
    """A flat row's nucleus (``d``: the row's weights): it holds a large part of the
    vocabulary, and stays dense (the dropped weights are zeroed), once it is needed."""
    if params.top_p >= _LAZY_TOP_P:
        return _lazy_nucleus(x, d, top, params, n)
    return _bracketed(x, d, top, params, n) or _binned(x, d, top, params, n)


#: a flat row's nucleus is left unlisted (:class:`Truncated`) from this top-p on: a draw then
#: needs 1 / top_p tries on average, each one pass over the row (listing it costs ~5)
_LAZY_TOP_P = 0.5
#: a token whose mass before it is this close (relative to the total) to top_p's share is
#: not placed by the float32 sums of a membership test: the nucleus is listed instead
_LAZY_MARGIN = 1e-5


_SCRATCH = threading.local()


def _scratch(padded: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """This thread's buffers for a membership test: float32 weights (``padded`` long, zero
    past ``size``) and a mask. Kept between rows: a fresh row-sized array per test costs more
    in page faults than the test itself (the C library hands freed ones back to the system)."""
    bufs = getattr(_SCRATCH, "bufs", None)
    if bufs is None or bufs[0].size != padded or bufs[1].size != size:
        bufs = _SCRATCH.bufs = (np.zeros(padded, np.float32), np.empty(size, bool))
    return bufs


def _lazy_nucleus(x: np.ndarray, d: Dense, top: float, params: SamplingParams,
                  n: int) -> Truncated:
    """A flat row's nucleus as a :class:`Truncated`: ``d`` (the row's weights) restricted to
    the tokens whose mass before them (heavier logits, and equal ones at lower ids) is short
    of top_p; listed (:func:`_bracketed`, :func:`_binned`) only if a probability is asked."""
    xc = x.copy()  # (the row is overwritten by the next decode; the test needs it later)
    goal = params.top_p * d.total
    margin = _LAZY_MARGIN * d.total

    def inside(y: int) -> bool | None:
        if _ROWS is not None and _floats(xc):
            before = _ROWS.mass_before(xc, d.w, y)
        else:
            masked, heavier = _scratch(d.w.size, xc.size)
            xy = xc[y]
            np.greater(xc, xy, out=heavier)
            np.multiply(d.w[: xc.size], heavier, out=masked[: xc.size])
            before = float(block_sums(masked).sum())
            tied = (xc[:y] == xy).nonzero()[0]
            if tied.size:
                before += float(d.w[tied].sum(dtype=np.float64))
        if before < goal - margin:
            return True
        if before >= goal + margin:
            return False
        return None

    # The nucleus's weight: at least top_p's share (it is the shortest prefix that reaches
    # it), at most the whole row's (each widened by the margin for float32 sums).
    mass = (goal - margin, d.total + margin)
    return Truncated(d, inside, lambda: _bracketed(xc, d, top, params, n)
                     or _binned(xc, d, top, params, n), mass)


#: relative rounding margin for a cut judged against float64 sums: the reference's total is a
#: pairwise sum over the whole row, the candidates' a running one
_EPS = 1e-12


def _high(x: np.ndarray, top: float, params: SamplingParams, ids: np.ndarray,
          w: np.ndarray, floor: float) -> float:
    """The most mass the nucleus can need, as seen from the candidates ``ids`` (weights
    ``w``; every other logit below ``floor``): top_p times the largest total the row can have."""
    with np.errstate(under="ignore", over="ignore"):
        rest = (x.size - ids.size) * math.exp(min((floor - top) / params.temperature, 700.0))
    return params.top_p * (float(w.sum()) + rest) * (1 + _EPS)


def _bounded(x: np.ndarray, top: float, params: SamplingParams, ids: np.ndarray,
             w: np.ndarray, floor: float, final: bool, n: int,
             order: np.ndarray | None = None, high: float | None = None) -> Sparse | None:
    """The nucleus among the candidates ``ids`` (ascending; float64 weights ``w``; ``order``:
    their :func:`_descending_order`, and ``high``: their :func:`_high`, if known), if their
    weights alone decide it.

    Every other logit is below ``floor``, so the row's total weight lies between the
    candidates' ``W`` and ``W + (V - |ids|) * exp((floor - top) / T)``. The nucleus keeps a
    token while the mass before it is below ``top_p`` times the total: if both ends of that
    range cut the candidates' descending order at the same place, that place is the cut, and
    no weight outside the candidates is ever computed. ``final``: the candidates are the min-p
    support, so a nucleus that keeps them all stops there. ``None`` if it is not decided.
    """
    outside = x.size - ids.size
    if outside:
        if high is None:
            high = _high(x, top, params, ids, w, floor)
        if high >= float(w.sum()) and not final:  # (a flat row: the nucleus may reach past them)
            return None
    if order is None:
        order = _descending_order(x, ids, w)
    ws = w[order]
    cum = ws.cumsum()
    before = cum - ws
    whole = order.size == ids.size  # (else the order's head)
    m = int(before.searchsorted(params.top_p * (cum[-1] if whole else w.sum()) * (1 - _EPS)))
    if m == order.size and not whole:  # the cut is past the head: the whole order
        return _bounded(x, top, params, ids, w, floor, final, n, None, high)
    if outside and not (final and m == ids.size):
        # the larger the total, the longer the nucleus: the smallest total gave m, the largest
        # must give it too (tokens past the candidates come after a mass of W > high: never)
        if int(before.searchsorted(high)) != m:
            return None
    keep = np.sort(order[:m])
    ids, w = ids[keep], w[keep]
    cut = w > 0.0
    if params.min_p > 0.0:
        cut &= w >= params.min_p * w.max()
    ids, w = ids[cut], w[cut]
    return Sparse(ids, w / w.sum(), n)


#: the flat-row search estimates the cut from a strided sample of this many weights, and
#: brackets it by this many sample ranks on either side
_SAMPLE = 4096
_BRACKET = 24


def _bracketed(x: np.ndarray, d: Dense, top: float, params: SamplingParams,
               n: int) -> Dense | None:
    """A flat row's nucleus, if a strided sample brackets its cut: the sample's running mass
    from the lightest token up (scaled) guesses the cut's weight, two weights a few sample
    ranks on either side of it bound a band, and two sums check that the cut lies in that band
    (if not, once more with a band 4x as wide). Every token above the band is then kept, every
    token below dropped, and only the band is sorted. ``None`` if the check fails (the caller
    falls back to :func:`_binned`)."""
    w = d.w  # padded with zeros to whole blocks
    goal = params.top_p * d.total
    stride = max(1, x.size // _SAMPLE)
    # from the bottom: the dropped tail is many light tokens, whose mass a sample estimates
    # well (the few heavy tokens at the top it does not)
    sample_ = np.sort(w[: x.size: stride])
    r = int((sample_.cumsum(dtype=np.float64) * stride).searchsorted(d.total - goal))
    # (the sample's estimate of the tail's mass is off by ~2% of it, median, and up to 10%
    # on the bench's rows: ~3% of flat rows miss the first band; the wider one costs a
    # fraction of the bins)
    for ranks in (_BRACKET, 4 * _BRACKET):
        if r < ranks or r + ranks >= sample_.size:
            return None
        lo, hi = sample_[r - ranks], sample_[r + ranks]
        # In place, with no new row-sized array: a 152k row and its weights already overflow
        # a 512 KiB L2, so every extra pass or temporary costs a trip to L3. Below the band
        # is dropped first (masked sums and stores are several times slower than products);
        # the mass above the band is then what is left minus the band.
        band_mask = w >= lo
        np.multiply(w, band_mask, out=w)
        mass_from_lo = float(block_sums(w).sum())
        band_mask ^= w > hi
        band = band_mask[: x.size].nonzero()[0]
        mass_above = mass_from_lo - float(w[band].sum(dtype=np.float64))
        if mass_above < goal <= mass_from_lo:
            return _cut_band(x, d, top, params, band, mass_above, n)
        # (the sample misjudged the cut: the weights whole again, for the next try or the bins)
        _dense_into(x, top, params.temperature, d.w[: x.size])
    return None


def _binned(x: np.ndarray, d: Dense, top: float, params: SamplingParams, n: int) -> Dense:
    """A flat row's nucleus, always: the weights are summed per bin of 1/8 octave (a float32's
    exponent and top 3 mantissa bits), and the bin where the running mass from the top crosses
    top_p is the band to sort: higher bins are kept, lower ones dropped."""
    w = d.w[: x.size]
    cut = params.top_p * d.total * (1 + _MARGIN)
    bins = np.right_shift(w.view(np.int32), _BIN_SHIFT)
    above = np.cumsum(np.bincount(bins, weights=w)[::-1])  # mass from the top bin down
    j = min(int(np.searchsorted(above, cut)), above.size - 1)
    b = above.size - 1 - j  # the crossing bin
    np.multiply(w, bins >= b, out=w)
    return _cut_band(x, d, top, params, np.flatnonzero(bins == b), above[j - 1] if j else 0.0, n)


def _cut_band(x: np.ndarray, d: Dense, top: float, params: SamplingParams, band: np.ndarray,
              mass_above: float, n: int) -> Dense:
    """Keep the band's tokens, in descending order (ties: lowest id), while the mass before
    them is short of top_p; zero the rest of the band. The kept mass is the result's total:
    its block sums wait until it is sampled (a target row asked only ``prob`` of its draft)."""
    wb = _weights(x, band, top, params.temperature)
    order = _descending_order(x, band, wb)
    ws = d.w[band[order]].astype(np.float64)
    drop = mass_above + np.cumsum(ws) - ws >= params.top_p * d.total
    d.w[band[order[drop]]] = 0.0
    ws[drop] = 0.0
    return Dense(d.w, n, mass_above + float(ws.sum()))


def _dense(x: np.ndarray, top: float, t: float, n: int, precise: bool = False) -> Dense:
    """Untruncated temperature: float32 weights exp((x - top) / t), with their total (and
    their block sums, in the same pass, where the row passes are compiled). ``precise``: a
    top-p cut will be placed against the total, so the compiled pass sums every weight in
    float64 (its faster float32 partials are ~1e-7 of a block off, which moved a token at the
    cut of one row in 2,808 against NumPy's path)."""
    size = -(-x.size // BLOCK) * BLOCK
    w = np.empty(size, np.float32)
    w[x.size:] = 0.0
    if _ROWS is not None and _floats(x):
        blocks = np.empty(size // BLOCK)
        return Dense(w, n, _ROWS.scaled_exp(x, w, top, _inverse(t), blocks, precise), blocks)
    return Dense(w, n, _dense_into(x, top, t, w[: x.size]))


def _floats(x: np.ndarray) -> bool:
    """Whether the compiled passes take ``x`` (they read C-contiguous float32 only)."""
    return x.dtype == np.float32 and x.flags.c_contiguous


def _inverse(t: float) -> float:
    """The factor NumPy's path scales by (``1 / t`` rounded to float32), exactly 1 for t = 1."""
    return 1.0 if t == 1.0 else float(np.float32(1.0 / t))


def _dense_into(x: np.ndarray, top: float, t: float, v: np.ndarray) -> float | None:
    """``v = exp((x - top) / t)`` in float32; their sum where the exp kernel gives it."""
    if _ROWS is not None and _floats(x) and _floats(v) and x.size == v.size:
        return _ROWS.scaled_exp(x, v, top, _inverse(t))
    if t == 1.0:
        return exp_shifted(x, top, v)
    # (x - top) first, then the scale: a likely token's exponent keeps its digits (x/T
    # first would round it to ~1e-7 of x/T, 2e-6 of the weight for logits near 20)
    np.subtract(x, np.float32(top), out=v)
    np.multiply(v, np.float32(1.0 / t), out=v)
    return exp_shifted(v, 0.0, v)


#: a multiple of every SIMD width ggml's exp kernel has (4, 8 or 16 floats)
_SIMD_ALIGN = 64


def exp_shifted(x: np.ndarray, shift: float, out: np.ndarray) -> float | None:
    """``out = exp(x - shift)`` for float32 arrays; returns the sum of ``out`` where the fast
    kernel gives it for free (``None`` otherwise).

    ggml's vectorised kernel where llama.cpp's library has it (2-4x NumPy's on x86, same
    accuracy: see :func:`edgespec._native.exp_kernel`), else NumPy. (Where the row passes are
    compiled, :func:`_dense_into` takes them and never gets here.)
    """
    kernel = exp_kernel()
    if (kernel is not None and x.dtype == out.dtype == np.float32 and x.size == out.size
            and x.flags.c_contiguous and out.flags.c_contiguous):
        # ggml finishes a row's last few values (past its SIMD width) with the C library's
        # scalar expf, which rounds differently: two tied logits would get different weights
        # and the tie would no longer go to the lowest id. So the kernel only ever sees whole
        # blocks of _SIMD_ALIGN, and the tail goes through it padded with -inf (weight 0).
        m = x.size - x.size % _SIMD_ALIGN
        total = kernel(m, out.ctypes.data, x.ctypes.data, shift) if m else 0.0
        if m < x.size:
            tail = np.full(_SIMD_ALIGN, -np.inf, np.float32)
            tail[: x.size - m] = x[m:]
            total += kernel(_SIMD_ALIGN, tail.ctypes.data, tail.ctypes.data, shift)
            out[m:] = tail[: x.size - m]
        return total
    with np.errstate(under="ignore"):
        if shift:
            np.subtract(x, np.float32(shift), out=out)
            np.exp(out, out=out)
        else:
            np.exp(x, out=out)
    return None


def _from_dense(probs: np.ndarray) -> AnyDist:
    ids = np.flatnonzero(probs)
    if ids.size == 1:
        return OneHot(int(ids[0]), probs.size)
    return Sparse(ids, probs[ids] / probs[ids].sum(), probs.size)


def process(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Turn one row of raw logits into the distribution that is actually sampled from.

    Returns float64 probabilities that sum to 1, with zeros where a filter removed a token.
    Raises ``ValueError`` on NaN logits or when every logit is ``-inf``.
    """
    x = np.asarray(logits, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"process() takes one row of logits, got shape {x.shape}")
    if np.isnan(x).any():
        raise LogitsError("the model's logits contain NaN: the GGUF file is corrupt or not "
                          "supported by this llama.cpp build")
    top = x.max()
    if top == -np.inf:
        raise LogitsError("every logit is -inf: no token can be sampled")
    if top == np.inf:
        # +inf logits: the limit of softmax is uniform over them. Map them to 0 and the rest to
        # -inf and go on, so greedy (lowest id, as the model drafter's argmax) and the filters
        # apply to that tie like to any other instead of being skipped.
        x = np.where(x == np.inf, 0.0, -np.inf)
        top = 0.0

    if params.greedy:
        probs = np.zeros_like(x)
        probs[int(np.argmax(x))] = 1.0
        return probs

    # The filters only compare weights with each other and with a fraction of their total or
    # maximum, so they run on the unnormalised weights: dividing first could round two
    # different weights onto one value and turn an order into a tie.
    probs = np.exp((x - top) / params.temperature)
    if params.top_k and params.top_k < probs.size:
        _keep_top_k(probs, params.top_k)
    if params.top_p < 1.0:
        _keep_nucleus(probs, params.top_p)
    if params.min_p > 0.0:
        probs[probs < params.min_p * probs.max()] = 0.0
    return probs / probs.sum()


def _keep_top_k(probs: np.ndarray, k: int) -> None:
    """Zero all but the k most likely tokens, in place (ties at the cut: lowest ids win)."""
    order = _descending(probs, k)
    cut = np.ones(probs.size, dtype=bool)
    cut[order[:k]] = False
    probs[cut] = 0.0


def _keep_nucleus(probs: np.ndarray, top_p: float) -> None:
    """Zero everything outside the smallest prefix (by descending probability) holding top_p."""
    total = probs.sum()
    n = min(_TOP_P_CANDIDATES, probs.size)
    order = _descending(probs, n)
    cum = np.cumsum(probs[order])
    if cum[-1] < top_p * total and n < probs.size:
        order = _descending(probs, probs.size)
        cum = np.cumsum(probs[order])
    # Keep a token while the mass before it is still short of top_p (so the token that crosses
    # the threshold is kept, and at least one token always is).
    before = cum - probs[order]
    keep = order[before < top_p * total]
    mask = np.ones(probs.size, dtype=bool)
    mask[keep] = False
    probs[mask] = 0.0


def _descending(probs: np.ndarray, n: int) -> np.ndarray:
    """Indices of the n largest probabilities, sorted descending, ties by ascending id."""
    if n < probs.size:
        part = np.argpartition(-probs, n - 1)[:n]
        # argpartition picks arbitrary ids among the values tied at the cut (top_k=1 over two
        # equal tokens could keep the second): refill the cut with the lowest tied ids.
        cut = probs[part].min()
        above = part[probs[part] > cut]
        part = np.concatenate([above, np.flatnonzero(probs == cut)[: n - above.size]])
    else:
        part = np.arange(probs.size)
    # lexsort: last key is primary. Sort by -prob, then by token id.
    return part[np.lexsort((part, -probs[part]))]
