"""Measuring a backend's costs: the calibration behind ``auto`` and ``bench --sweep``.

Each function takes any backend with ``sync``/``decode``/``tokens`` (the real one is
:class:`edgespec.runtime.backend.LlamaBackend`) and a ``clock`` (``time.perf_counter`` where none
is given; tests pass a simulated one), and returns seconds; what they mean is
:mod:`edgespec.core.costs`'s. Every function leaves the backend's cache holding filler tokens:
callers ``sync`` to their own text afterwards, as the loop always does.
"""

from __future__ import annotations

import time
from typing import Protocol, Sequence

import numpy as np

from ..core.costs import CallCosts, Clock, CostCurve


def _filler(model: "Scorer", n: int) -> list[int]:
    """n ordinary token ids to measure with (their values do not change the cost)."""
    n_vocab = getattr(model, "n_vocab", 1 << 16)
    return [(300 + i) % n_vocab for i in range(n)]


class Scorer(Protocol):
    n_ctx: int
    n_vocab: int
    tokens: list[int]

    def sync(self, prefix: Sequence[int]) -> int: ...

    def decode(self, tokens: Sequence[int], n_logits: int) -> np.ndarray: ...


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


def relation_times(target: Scorer, widths: Sequence[int], *, repeats: int = 1,
                   context: int = 32, budget_s: float | None = None, clock: Clock | None = None,
                   ) -> dict[int, tuple[float, float, float]]:
    """For each width w, three calls of w after a call of another width, timed: on a device
    that keeps a graph per width the first runs without a graph (S(w) + U), the second captures
    one (S(w) + C), the third replays it (S(w)); elsewhere all three cost S(w). Each the median
    over up to ``repeats`` passes, as far as ``budget_s`` goes (the first pass always: a deep
    model's calls are slow, and its costs are what a calibration is for)."""
    widths = [n for n in dict.fromkeys(widths) if n >= 1]
    context = max(0, min(context, target.n_ctx - max(widths, default=1) - 1))
    widths = [n for n in widths if context + n <= target.n_ctx]
    prefix = _filler(target, context)
    other = _filler(target, widths[0] + 1)
    clock = clock or time.perf_counter
    start = clock()
    samples: dict[int, list[list[float]]] = {}
    for _ in range(max(1, repeats)):
        _timed_decode(target, prefix, other, len(other), clock)  # (each pass after another width)
        for n in widths:
            samples.setdefault(n, []).append(
                [_timed_decode(target, prefix, _filler(target, n), n, clock) for _ in range(3)])
        if budget_s is not None and clock() - start > budget_s:
            break
    return {n: tuple(float(x) for x in np.median(np.array(v), axis=0))
            for n, v in samples.items()}


def measure_relations(target: Scorer, widths: Sequence[int], *, repeats: int = 1,
                      budget_s: float | None = None, clock: Clock | None = None,
                      ) -> tuple[dict[int, float], float, float]:
    """(S by width, U, C) from :func:`relation_times`; U and C are taken as the same for every
    width (the median over widths: a sweep on an H200 found each within +-15% of its mean from
    width 1 to 33), at least 0."""
    times = relation_times(target, widths, repeats=repeats, budget_s=budget_s, clock=clock)
    steady = {n: t[2] for n, t in times.items()}
    changed = float(np.median([t[0] - t[2] for t in times.values()]))
    second = float(np.median([t[1] - t[2] for t in times.values()]))
    return steady, max(changed, 0.0), max(second, 0.0)


def measure_call_costs(target: Scorer, widths: Sequence[int], *, graphs: bool, width: int = 0,
                       repeats: int = 1, budget_s: float | None = None,
                       clock: Clock | None = None) -> CallCosts:
    """The target's :class:`~edgespec.core.costs.CallCosts`: with ``graphs`` (a device that
    keeps a graph per width) :func:`measure_relations`; else one call per width and pass
    (:func:`measure_target_curve`), U = C = 0. ``width``: a fixed width (every call that
    wide: one price)."""
    if width:
        widths = (width,)
    if graphs and not width:
        points, changed, second = measure_relations(target, widths, repeats=repeats,
                                                    budget_s=budget_s, clock=clock)
        return CallCosts(CostCurve(points), changed, second, graphs=True)
    points = measure_target_curve(target, widths, repeats=repeats, budget_s=budget_s,
                                  clock=clock)
    return CallCosts(CostCurve(points, width=width))
