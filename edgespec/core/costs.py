"""What speculation costs on this machine: the target's batch-scoring curve t(n), the draft's
per-token cost, and what they imply.

``t(n)`` is the wall time of one target call that scores ``n`` tokens (``[last] + n - 1`` drafts)
and returns ``n`` rows of logits. On a GPU it is nearly flat in ``n``; on a small CPU it grows
almost linearly, and then drafting rarely pays. :class:`CostCurve` holds measured points,
interpolates between them and refines them online from the timings of real rounds.

:func:`measure_target_curve` and :func:`measure_draft_cost` take any backend with
``sync``/``decode``/``tokens`` (the real one is :class:`edgespec.runtime.backend.LlamaBackend`), and
a ``clock`` (seconds, ``time.perf_counter`` by default: tests pass a simulated one); the rest is
pure arithmetic.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import numpy as np


def _filler(model: "Scorer", n: int) -> list[int]:
    """n ordinary token ids to measure with (their values do not change the cost)."""
    n_vocab = getattr(model, "n_vocab", 1 << 16)
    return [(300 + i) % n_vocab for i in range(n)]

#: Weight of a new observation in the running estimate of t(n).
_EMA = 0.2


class Scorer(Protocol):
    n_ctx: int
    n_vocab: int
    tokens: list[int]

    def sync(self, prefix: Sequence[int]) -> int: ...

    def decode(self, tokens: Sequence[int], n_logits: int) -> np.ndarray: ...


#: A clock in seconds; ``None`` means ``time.perf_counter`` (looked up at call time).
Clock = Callable[[], float]


def _timed_decode(model: Scorer, context: Sequence[int], batch: Sequence[int], n_logits: int,
                  clock: Clock | None = None) -> float:
    clock = clock or time.perf_counter
    model.sync(context)
    if len(model.tokens) < len(context):
        model.decode(list(context[len(model.tokens):]), 0)
    t0 = clock()
    model.decode(list(batch), n_logits)
    return clock() - t0


def measure_target_curve(
    target: Scorer, ns: Sequence[int] = (1, 4, 16), *, repeats: int = 1, context: int = 32,
    budget_s: float | None = None, clock: Clock | None = None,
) -> dict[int, float]:
    """Seconds per target call scoring n tokens (n logit rows), after ``context`` cached tokens.

    One warm-up call first (the first call after loading pays page faults; it is not counted in
    the budget). Then passes over ``ns`` in the order given, up to ``repeats`` of them, each point
    the median of its samples: interleaved passes spread a noisy moment (a GPU's clock ramping,
    another process) over all points instead of skewing one. With ``budget_s``, stops once the
    budget is spent (the first n is always measured): list the points that matter most first.
    On a small CPU one pass spends the budget; on a GPU, where a call takes milliseconds, every
    point gets its ``repeats`` samples. Leaves the cache holding filler tokens: callers ``sync``
    to their own text afterwards, as the loop always does.
    """
    ns = [n for n in dict.fromkeys(ns) if n >= 1]
    context = max(0, min(context, target.n_ctx - max(ns, default=1)))
    ns = [n for n in ns if context + n <= target.n_ctx]
    clock = clock or time.perf_counter
    prefix = _filler(target, context)
    _timed_decode(target, prefix, _filler(target, 1), 1, clock)
    start = clock()
    samples: dict[int, list[float]] = {}
    for _ in range(max(1, repeats)):
        for n in ns:
            samples.setdefault(n, []).append(
                _timed_decode(target, prefix, _filler(target, n), n, clock))
            if budget_s is not None and clock() - start > budget_s:
                return {n: float(np.median(v)) for n, v in samples.items()}
    return {n: float(np.median(v)) for n, v in samples.items()}


def warm_widths(model: Scorer, widths: Sequence[int], *, context: int = 32) -> list[int]:
    """One call of each width in ``widths`` (n tokens with n logit rows, as a verification
    call reads them), after ``context`` cached filler tokens; nothing is timed. Returns the
    widths called: those that fit the context. Leaves the cache holding filler tokens, as
    :func:`measure_target_curve` does."""
    widths = [n for n in dict.fromkeys(widths) if 1 <= n <= model.n_ctx]
    context = max(0, min(context, model.n_ctx - max(widths, default=1)))
    prefix = _filler(model, context)
    for n in widths:
        _timed_decode(model, prefix, _filler(model, n), n)
    return widths


def measure_steady(target: Scorer, n: int = 1, *, calls: int = 4, context: int = 32,
                   clock: Clock | None = None) -> float:
    """Seconds per target call scoring n tokens when the calls before it had the same shape:
    ``calls`` such calls in a row, the median of all but the first.

    :func:`measure_target_curve` interleaves its widths, so each of its calls follows a call of
    another shape. On a GPU that is dearer: llama.cpp's CUDA backend replays a captured graph
    only for a shape repeated (seen on an H200: t(1) 3.3 ms interleaved, 2.0 ms repeated).
    The difference is the switch penalty of :class:`CostCurve`."""
    context = max(0, min(context, target.n_ctx - n))
    prefix = _filler(target, context)
    samples = [_timed_decode(target, prefix, _filler(target, n), n, clock)
               for _ in range(max(2, calls))]
    return float(np.median(samples[1:]))


def lone_round_time(target: Scorer, width: int, *, context: int = 32,
                    clock: Clock | None = None) -> float:
    """Seconds of a lone call of ``width`` among plain (single-token) calls, with the two plain
    calls after it: three plain calls first (the third replays a graph where the device keeps
    them), then, timed, the call of ``width`` and two plain calls."""
    context = max(0, min(context, target.n_ctx - width - 1))
    prefix = _filler(target, context)
    one = _filler(target, 1)
    for _ in range(3):
        _timed_decode(target, prefix, one, 1, clock)
    return (_timed_decode(target, prefix, _filler(target, width), width, clock)
            + sum(_timed_decode(target, prefix, one, 1, clock) for _ in range(2)))


def return_excess(lone: float, switched_w: float, switched_1: float) -> float:
    """What a lone round (:func:`lone_round_time`) cost beyond its call and its two plain calls
    at their switched prices (steady cost plus the switch penalty P each): the sample of
    :attr:`CostCurve.return_penalty`."""
    return lone - switched_w - 2.0 * switched_1


def measure_return_penalty(target: Scorer, curve: "CostCurve",
                           widths: Sequence[int] = (5, 17), *, runs: int = 2,
                           context: int = 32, budget_s: float | None = None,
                           clock: Clock | None = None) -> float:
    """Seconds a lone call of another width costs, with the two plain calls after it, beyond
    what the curve says of them (:func:`return_excess`, t(w) + P and t(1) + P; P:
    ``curve.switch_penalty``, t: the ``curve``'s steady costs). See
    :attr:`CostCurve.return_penalty`. The median over ``runs`` passes over ``widths``, as far
    as ``budget_s`` goes (the first sample always), at least 0 (a machine without graphs has
    nothing more to pay: noise around 0)."""
    clock = clock or time.perf_counter
    penalty = curve.switch_penalty
    samples = []
    start = clock()
    for _ in range(max(1, runs)):
        for w in widths:
            samples.append(return_excess(lone_round_time(target, w, context=context, clock=clock),
                                         curve(w) + penalty, curve(1) + penalty))
            if budget_s is not None and clock() - start > budget_s:
                return max(float(np.median(samples)), 0.0)
    return max(float(np.median(samples)), 0.0)


def split_switch_penalty(interleaved: dict[int, float], steady_t1: float,
                         min_fraction: float = 0.1) -> tuple[dict[int, float], float]:
    """Interleaved measurements as (steady costs, switch penalty): the penalty is what t(1)
    costs more after another shape, taken off every point (each of them followed another
    shape); under ``min_fraction`` of the steady t(1) it is noise (a CPU has no such effect)
    and the points stay as measured."""
    penalty = interleaved.get(1, steady_t1) - steady_t1
    if penalty < min_fraction * steady_t1:
        return dict(interleaved), 0.0
    return {n: max(t - penalty, 1e-6) for n, t in interleaved.items()}, penalty


def measure_draft_cost(draft: Scorer, n: int = 8, *, repeats: int = 1, context: int = 32,
                       budget_s: float | None = None, clock: Clock | None = None) -> float:
    """Seconds per drafted token: n single-token decodes with one logit row each, as a drafter
    makes them (after a warm-up call); the median of up to ``repeats`` such runs, each run only
    if it fits in what is left of ``budget_s`` (the first always runs)."""
    context = max(0, min(context, draft.n_ctx - n - 1))
    prefix = _filler(draft, context)
    filler = _filler(draft, n)
    clock = clock or time.perf_counter
    _timed_decode(draft, prefix, filler[:1], 1, clock)
    samples = []
    start = clock()
    for _ in range(max(1, repeats)):
        draft.sync(prefix)
        t0 = clock()
        for tok in filler:
            draft.decode([tok], 1)
        samples.append((clock() - t0) / n)
        if budget_s is not None and clock() - start + samples[-1] * n > budget_s:
            break
    return float(np.median(samples))


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
    #: seconds a call costs more when the call before it had another shape (see
    #: :func:`measure_steady`); the points are the costs of repeated shapes
    switch_penalty: float = 0.0
    #: seconds a lone call of another width between plain steps costs beyond three switch
    #: penalties (its own, and the two plain calls after it: one without a graph, one that
    #: captures it): in llama.cpp's CUDA backend the capture of the plain step's graph and
    #: the dearer first call after a replayed graph. 0 without a switch penalty. Measured by
    #: :func:`measure_return_penalty`, refined by :meth:`observe_return`.
    return_penalty: float = 0.0

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

    def observe(self, n: int, seconds: float, switched: bool = False) -> None:
        """Blend in the time a real call of n tokens took: a plain mean over the first few
        observations (one noisy calibration sample must not outweigh real rounds), then a
        running average that follows the machine's load. ``switched``: the call replayed no
        graph (the first or second of its width in a row), so it paid the switch penalty,
        which is not part of t(n)."""
        if switched:
            if n == 1 and self.switch_penalty and not self.width:
                # A plain call that paid a penalty says little of t(1), which thousands of
                # replayed plain steps measure, and much of the penalties: the capture after
                # a lone round costs ~2.5 steps on an H100, and blended in (capped at 2 t(1))
                # it raised t(1) by ~20% for a few steps, making drafting look cheaper just
                # after it had cost the most. :meth:`observe_return` learns from it instead.
                return
            seconds = max(seconds - self.switch_penalty, 1e-6)
        if self.width:
            n, seconds = self.width, seconds / self._calls(n)
        # One call counts at most OUTLIER times what the curve says: a stalled call (seen on
        # a GPU: 17-25 ms for a 3-token call that costs ~3) must not become a point by itself;
        # a real slow-down still shows within a few calls. Faster is taken as measured (a
        # call cannot run faster than the machine does: the curve was pessimistic). What the
        # curve says is taken as no less than any shorter point: scoring more tokens never
        # costs less, and a curve that said so (an extension tilted by noise) clamped every
        # real observation to twice its own mistake, which then tilted it further: t(33)
        # fell to 0.01 ms on a noisy replay of this CPU.
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

    def observe_return(self, seconds: float) -> None:
        """Blend in a sample of :attr:`return_penalty`: what a lone round from steady plain
        decoding cost beyond the curve (its own call's time less t(w) + P, its two plain
        steps' times less t(1) + P each). Capped at OUTLIER times the estimate or t(1),
        whichever is more (a stalled call is not a penalty); at least 0."""
        cap = OUTLIER * max(self.return_penalty, self(1))
        self.return_penalty += _EMA * (min(max(seconds, 0.0), cap) - self.return_penalty)


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
