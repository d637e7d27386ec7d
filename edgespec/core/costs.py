"""What speculation costs on this machine: the target's call costs and what they imply.

:class:`CostCurve` is the target's steady batch-scoring curve S(n): the wall time of one call that
scores ``n`` tokens (``[last] + n - 1`` drafts) and returns ``n`` rows of logits, when the calls
before it had the same width. On a GPU it is nearly flat in ``n``; on a small CPU it grows almost
linearly, and then drafting rarely pays. It holds measured points, interpolates between them
and is refined online from the timings of real rounds.

:class:`CallCosts` is a call's time given the calls before it: S(w), plus U for a call whose width
differs from the last call's, plus C for the second call of a width in a row. A device that
keeps one captured graph per width (llama.cpp's CUDA backend) runs the first call of a new width
without a graph and captures one on the second; elsewhere (a CPU, a fixed width) U = C = 0.

Pure arithmetic; measuring a backend is :mod:`edgespec.runtime.calibration`'s.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Callable

import numpy as np


#: A clock in seconds (``time.perf_counter`` where none is given; tests pass a simulated one).
Clock = Callable[[], float]

#: Weight of a new observation in the running estimates.
_EMA = 0.2


@dataclass
class CostCurve:
    """Measured t(n) points, piecewise-linear in between, refined by online observations.

    Beyond the largest measured n the last segment's slope is extended (a GPU's flat curve
    stays flat, a CPU's linear one stays linear). With ``width`` (a target at a fixed width,
    every call that many tokens wide) t is a staircase instead: n tokens take ceil(n / width)
    calls of one price, kept as the single point ``width``.
    """

    points: dict[int, float] = field(default_factory=dict)
    #: observations behind each point (a calibration measurement counts as one)
    counts: dict[int, int] = field(default_factory=dict)
    width: int = 0

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("a cost curve needs at least one measured point")
        self.points = {int(n): float(t) for n, t in self.points.items()}
        self.counts = {n: int(self.counts.get(n, 1)) for n in self.points}
        if self.width:
            per_call = [t / self._calls(n) for n, t in self.points.items()]
            self.points = {self.width: float(np.median(per_call))}
            self.counts = {self.width: len(per_call)}
        self._ns = sorted(self.points)
        self._times = [self.points[n] for n in self._ns]  #: points' times, in order
        #: the same as an array, made when ``table`` needs it (None: stale); observe runs
        #: every round, where a NumPy write costs ~10 µs in the cold caches after a decode
        self._times_array: np.ndarray | None = None
        self._weights: np.ndarray | None = None

    def _calls(self, n: int) -> int:
        return -(-max(n, 1) // self.width)

    def lower_bound(self, lo: int, hi: int) -> float:
        """A number no larger than t(n) for any n in [lo, hi] (as ``table`` gives them): the
        staircase of a fixed width never falls, and a piecewise-linear curve (extended beyond
        its ends) is least at one of its points or at an end of the range."""
        if self.width:
            return self(lo)
        inside = [self.points[n] for n in self._ns if lo < n < hi]
        return min(self(lo), self(hi), *inside)

    def shape(self, n: int) -> int:
        """The width of the call that scores n tokens (at a fixed width: always that width)."""
        return self.width or n

    def _segment(self, n: int) -> tuple[int, int, float]:
        """Where t(n) lies: the indices (in point order) of the two points whose line gives it
        (the ones around n, else an end pair) and the weight of the second, so that
        t(n) = (1 - w) t_lo + w t_hi. The one rule behind ``__call__`` and ``table``.

        Beyond the last point L the line is the one from the last point at or below L / 2 to
        L, not the last segment: the loop adds points where it plays, often next to a measured
        one, and the slope between neighbours is noise. One call of 17 tokens observed at
        0.96 t(16) on this CPU made the last segment's extension say t(33) = 0.22 s where it
        is ~1.3 s, and ``auto`` played 32-token drafts on every prompt after it (0.68x of
        plain decoding on one). The calibration's own points are spaced so that this is
        their last segment."""
        ns = self._ns
        last = len(ns) - 1
        if n > ns[last]:
            lo = min(max(bisect.bisect_right(ns, ns[last] / 2) - 1, 0), last - 1)
            return lo, last, (n - ns[lo]) / (ns[last] - ns[lo])
        i = min(max(bisect.bisect_left(ns, n), 1), last)
        return i - 1, i, (n - ns[i - 1]) / (ns[i] - ns[i - 1])

    def __call__(self, n: int) -> float:
        if self.width:
            return self._calls(n) * self.points[self.width]
        t = self.points.get(n)
        if t is not None:
            return t
        if len(self._ns) == 1:
            only = self._ns[0]
            return self.points[only] * n / only
        lo, hi, w = self._segment(n)
        times = self._times
        return max(times[lo] + w * (times[hi] - times[lo]), 1e-6)

    def table(self, n_max: int) -> np.ndarray:
        """``t(n)`` for n = 0 .. n_max as one array (index n; index 0 means nothing), the values
        ``__call__`` gives: the auto drafter's per-round choice reads a whole row of them, and
        on a GPU a round has tens of microseconds, not the ~3 µs a Python call per n costs.

        Piecewise-linear interpolation (and its extension beyond the ends) is linear in the
        measured times, so the row is one product of a weight matrix, which depends only on
        where the points are (rebuilt when a point is added), with the times (which move every
        round)."""
        if self.width:
            return self._calls_upto(n_max) * self.points[self.width]
        weights = self._weights
        if weights is None or len(weights) <= n_max:
            weights = self._weights = self._weight_matrix(max(n_max, _TABLE_ROWS - 1))
        times = self._times_array
        if times is None:
            times = self._times_array = np.array(self._times)
        return np.maximum(weights[: n_max + 1] @ times, 1e-6)

    def _calls_upto(self, n_max: int) -> np.ndarray:
        return np.ceil(np.maximum(counts_upto(n_max), 1.0) / self.width)

    def _weight_matrix(self, n_max: int) -> np.ndarray:
        """M with t(n) = M[n] @ [t at each point, in order], as ``__call__`` interpolates."""
        ns = self._ns
        if len(ns) == 1:
            return (counts_upto(n_max) / ns[0])[:, None]
        m = np.zeros((n_max + 1, len(ns)))
        for n in range(n_max + 1):
            lo, hi, w = self._segment(n)
            m[n, lo], m[n, hi] = 1.0 - w, w
        return m

    def observe(self, n: int, seconds: float) -> None:
        """Blend in the time a real call of n tokens took: a plain mean over the first few
        observations (one noisy calibration sample must not outweigh real rounds), then a
        running average that follows the machine's load."""
        if self.width:
            n, seconds = self.width, seconds / self._calls(n)
        # One call counts at most OUTLIER times what the curve says: a stalled call (seen on
        # a GPU: 17-25 ms for a 3-token call that costs ~3) must not become a point by itself;
        # a real slow-down still shows within a few calls. Faster is taken as measured (the
        # curve was pessimistic). What the curve says is taken as no less than any shorter
        # point: scoring more tokens never costs less, and a curve that said so (an extension
        # tilted by noise) would clamp every real observation to twice its own mistake.
        ref = self(n)
        at = bisect.bisect_left(self._ns, n)  # (n's index, or where it goes; 0 at a fixed width)
        if at:
            ref = max(ref, max(self._times[:at]))
        seconds = min(seconds, ref * OUTLIER)
        if n in self.points:
            count = self.counts[n] = self.counts.get(n, 1) + 1
            self.points[n] += max(_EMA, 1.0 / count) * (seconds - self.points[n])
            self._times[at] = self.points[n]
            self._times_array = None
        else:
            self.points[n] = seconds
            self.counts[n] = 1
            bisect.insort(self._ns, n)
            self._times = [self.points[m] for m in self._ns]
            self._times_array = self._weights = None


#: how a call relates to the calls before it (CallCosts.relation)
SETTLED, SECOND, CHANGED = 0, 1, 2


@dataclass
class CallCosts:
    """A target call's time given the calls before it: S(w) + U (a new width) or + C (the
    second call of a width in a row); see the module's docstring. ``graphs``: the device keeps
    a graph per width (else U and C stay 0, and every call's time is S's)."""

    steady: CostCurve
    changed: float = 0.0  #: U
    second: float = 0.0  #: C
    graphs: bool = False

    def shape(self, n: int) -> int:
        """The width of the call that scores n tokens: n, or the fixed width."""
        return self.steady.shape(n)

    def relation(self, width: int, last: int | None, run: int) -> int:
        """SETTLED, SECOND or CHANGED: a call of ``width`` after ``run`` calls of ``last``
        (always SETTLED without graphs)."""
        if not self.graphs:
            return SETTLED
        if width != last:
            return CHANGED
        return SECOND if run == 1 else SETTLED

    def excess(self, width: int, last: int | None, run: int) -> float:
        """What such a call pays beyond S(width): U, C or nothing."""
        return (0.0, self.second, self.changed)[self.relation(width, last, run)]

    def __call__(self, width: int, last: int | None, run: int) -> float:
        return self.steady(width) + self.excess(width, last, run)

    def least_after(self, width: int, last: int | None, run: int) -> "CallCosts":
        """These costs with the excess that one more call of ``width`` (after ``run`` calls of
        ``last``) would refine at its least: a sample is never below 0, so it keeps at least
        1 - the running average's weight of itself. S is shared, not copied."""
        rel = self.relation(width, last, run)
        keep = 1.0 - _EMA
        return CallCosts(self.steady, self.changed * (keep if rel == CHANGED else 1.0),
                         self.second * (keep if rel == SECOND else 1.0), self.graphs)

    def observe(self, width: int, last: int | None, run: int, seconds: float) -> None:
        """A call of ``width`` after ``run`` calls of width ``last`` took ``seconds``: a settled
        call refines S(width), another the excess of its relation (capped as S's samples are)."""
        rel = self.relation(width, last, run)
        if rel == SETTLED:
            self.steady.observe(width, seconds)
            return
        base = self.steady(width)
        attr = "changed" if rel == CHANGED else "second"
        excess = getattr(self, attr)
        sample = min(max(seconds - base, 0.0), OUTLIER * max(excess, base))
        setattr(self, attr, excess + _EMA * (sample - excess))


#: the most one observed call may differ from the curve, as a factor (CostCurve.observe)
OUTLIER = 2.0

#: rows of the cached weight matrix: t(0) .. t(64), the longest draft (+ 1) the CLI allows
_TABLE_ROWS = 66
_COUNTS = np.arange(_TABLE_ROWS + 1, dtype=np.float64)
_COUNTS.setflags(write=False)


def counts_upto(n_max: int, start: int = 0) -> np.ndarray:
    """start, start + 1, ..., n_max as float64 (the k axis of per-k arithmetic): a read-only
    view of a shared array where it is long enough (no allocation)."""
    if n_max < len(_COUNTS):
        return _COUNTS[start: n_max + 1]
    return np.arange(start, n_max + 1, dtype=np.float64)


def expected_tokens(alpha: float, k: int) -> float:
    """Expected tokens one round emits when each of k drafts is accepted with probability
    ``alpha`` independently of the others (Leviathan et al. 2023, eq. 1): (1 - a^(k+1)) / (1 - a)."""
    if k <= 0:
        return 1.0
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def expected_tokens_upto(alpha: float, k_max: int) -> np.ndarray:
    """:func:`expected_tokens` for k = 1 .. k_max as one array (index k - 1)."""
    k_plus_1 = counts_upto(k_max + 1, start=2)
    if alpha >= 1.0:
        return k_plus_1.copy()
    out = np.power(alpha, k_plus_1)
    np.subtract(1.0, out, out=out)
    out /= 1.0 - alpha
    return out


def break_even_acceptance(curve: CostCurve | dict[int, float], k: int, draft_cost: float = 0.0) -> float:
    """Smallest per-token acceptance at which drafting k tokens is as fast as plain decoding.

    Solves expected_tokens(a, k) / (t(k + 1) + k * draft_cost) = 1 / t(1) for a by bisection;
    returns ``inf`` when even a = 1 cannot pay for the round.
    """
    t = curve if isinstance(curve, CostCurve) else CostCurve(dict(curve))
    need = (t(k + 1) + k * draft_cost) / t(1)  # tokens the round must emit to break even
    if need > k + 1:
        return float("inf")
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        if expected_tokens(mid, k) < need:
            lo = mid
        else:
            hi = mid
    return hi
