"""Processed distributions in the form that is cheapest to build from one row of logits.

:func:`edgespec.core.sampling.distribution` returns one of these instead of a dense
vocabulary-sized vector:

- :class:`OneHot`: greedy. Built with one ``argmax``.
- :class:`Sparse`: top-k, top-p and min-p keep a small support; it is found among a candidate
  set cut by a logit threshold before any ``exp``, sort or ``cumsum``.
- :class:`Dense`: plain temperature sampling, whose support is the whole vocabulary: the
  weights are computed once, in float32, with sums per block of 256 ids so that drawing a
  token costs two short ``cumsum``s instead of one over the vocabulary.
- :class:`Truncated`: a flat row's top-p: the Dense weights and a membership test, sampled by
  rejection; the nucleus (~100k tokens) is only listed if a probability is asked.
- :class:`Pending`: a plain-temperature target row known only by bounds on each probability
  (from its column maxima) until a value or a draw is needed: a row that only has to accept
  its draft never computes its normaliser (an ``exp`` of the whole row).
- :class:`Exact`: a wrapper around a dense float64 probability vector (the reference
  :func:`edgespec.core.sampling.process`), for tests and rare fallbacks.

All of them answer ``prob(x)`` and ``sample(rng)`` and can give the dense vector (``dense()``,
O(V): only fallbacks and tests use it). Pure NumPy.
"""

from __future__ import annotations

from typing import Protocol, Union

import numpy as np

#: ids per block of a Dense distribution's partial sums
BLOCK = 256
_ONES = np.ones(BLOCK, np.float32)


class Dist(Protocol):
    """A processed distribution over ``n`` token ids."""

    n: int

    def prob(self, x: int) -> float: ...

    def sample(self, rng: np.random.Generator) -> int: ...

    def dense(self) -> np.ndarray: ...


class OneHot:
    """All mass on one token (greedy decoding). Sampling consumes no randomness."""

    __slots__ = ("token", "n")

    def __init__(self, token: int, n: int) -> None:
        self.token = token
        self.n = n

    def prob(self, x: int) -> float:
        return 1.0 if x == self.token else 0.0

    def sample(self, rng: np.random.Generator) -> int:
        return self.token

    def support(self) -> tuple[np.ndarray, np.ndarray]:
        return np.array([self.token], np.int64), np.ones(1)

    def dense(self) -> np.ndarray:
        out = np.zeros(self.n)
        out[self.token] = 1.0
        return out


class Sparse:
    """Mass on a few ids: ``ids`` ascending, ``probs`` float64 summing to 1 (all > 0)."""

    __slots__ = ("ids", "probs", "n", "_cdf")

    def __init__(self, ids: np.ndarray, probs: np.ndarray, n: int) -> None:
        self.ids = ids
        self.probs = probs
        self.n = n
        self._cdf: np.ndarray | None = None

    def prob(self, x: int) -> float:
        i = int(self.ids.searchsorted(x))
        return float(self.probs[i]) if i < self.ids.size and self.ids[i] == x else 0.0

    def sample(self, rng: np.random.Generator) -> int:
        # The inverse CDF in id order, like the reference `sample` on the dense vector (whose
        # zeros add nothing to the running sum): the same uniform gives the same token.
        if self._cdf is None:
            self._cdf = self.probs.cumsum()
        cdf = self._cdf
        i = int(cdf.searchsorted(rng.random() * float(cdf[-1]), "right"))
        return int(self.ids[min(i, cdf.size - 1)])

    def support(self) -> tuple[np.ndarray, np.ndarray]:
        return self.ids, self.probs

    def dense(self) -> np.ndarray:
        out = np.zeros(self.n)
        out[self.ids] = self.probs
        return out


class Dense:
    """Weights over the first ``len(w)`` ids (float32, unnormalised; ids past them have
    probability 0), with sums per block of :data:`BLOCK` ids."""

    __slots__ = ("w", "n", "total", "_blocks", "_cum")

    def __init__(self, w: np.ndarray, n: int, total: float | None = None,
                 blocks: np.ndarray | None = None) -> None:
        """``w``: weights padded with zeros to a multiple of :data:`BLOCK` (it is kept);
        ``total``: their sum, if known (then the block sums wait for the first ``sample``:
        a target row that is only asked ``prob`` of its draft never needs them);
        ``blocks``: the block sums (float64), if known with the total."""
        self.w = w
        self.n = n
        self._blocks: np.ndarray | None = blocks if total is not None else None
        if total is None:
            self._blocks = block_sums(w)
            total = float(self._blocks.sum())
        self.total = total
        self._cum: np.ndarray | None = None

    @property
    def blocks(self) -> np.ndarray:
        """float64 sums of the weights per block of :data:`BLOCK` ids."""
        if self._blocks is None:
            self._blocks = block_sums(self.w)
        return self._blocks

    def prob(self, x: int) -> float:
        return float(self.w[x]) / self.total if x < self.w.size else 0.0

    def sample(self, rng: np.random.Generator) -> int:
        # (array methods, not np.cumsum / np.searchsorted: their Python wrappers cost ~2 µs a
        # call, a third of a draw)
        if self._cum is None:
            self._cum = self.blocks.cumsum()
        cum, blocks = self._cum, self.blocks
        u = rng.random() * float(cum[-1])
        b = min(int(cum.searchsorted(u, "right")), cum.size - 1)
        while blocks[b] == 0.0:  # u rounded onto the end of the CDF
            b -= 1
        u -= float(cum[b - 1]) if b else 0.0
        local = self.w[b * BLOCK:(b + 1) * BLOCK].cumsum(dtype=np.float64)
        u *= float(local[-1]) / float(blocks[b])  # the block's float32 sum -> its float64 sum
        j = min(int(local.searchsorted(u, "right")), BLOCK - 1)
        while self.w[b * BLOCK + j] == 0.0:
            j -= 1
        return b * BLOCK + j

    def dense(self) -> np.ndarray:
        out = np.zeros(self.n)
        m = min(self.n, self.w.size)
        out[:m] = self.w[:m]
        return out / self.total


class Truncated:
    """A :class:`Dense` distribution restricted to a subset that is costly to list but cheap to
    test one token against (a flat row's top-p nucleus: ~100k tokens).

    Sampling draws from the whole distribution and keeps a draw inside the subset (rejection
    sampling: each try succeeds with probability equal to the subset's mass, top_p), so a row
    that is only sampled never lists its subset. ``prob``, ``dense`` and a draw the test cannot
    call list it (``resolve``, once; it may reuse the whole distribution's weights, which are
    not used again).
    """

    __slots__ = ("full", "n", "mass", "_inside", "_resolve", "_listed", "_known")

    #: tries before the subset is listed and sampled directly (with top_p >= 0.5, at most
    #: ~6% of draws get there)
    TRIES = 4

    def __init__(self, full: Dense, inside, resolve, mass: tuple[float, float]) -> None:
        """``inside(y)``: whether token ``y`` is in the subset, or ``None`` when too close to
        call; ``resolve()``: the subset as a :class:`Dense` (zero weight outside it);
        ``mass``: bounds on the subset's total weight (that of the listed form included)."""
        self.full = full
        self.n = full.n
        self.mass = mass
        self._inside = inside
        self._resolve = resolve
        self._listed: Dense | None = None
        self._known: dict[int, bool] = {}  #: memberships tested so far

    def listed(self) -> Dense:
        """The subset listed: the distribution as a :class:`Dense`."""
        if self._listed is None:
            self._listed = self._resolve()
            self._inside = self._resolve = None  # (their buffers go with them)
            self._known.clear()
        return self._listed

    def prob(self, x: int) -> float:
        return self.listed().prob(x)

    def prob_bounds(self, x: int) -> tuple[float, float]:
        """Bounds on ``prob(x)`` that need no listing: ``x``'s weight over the largest and the
        smallest mass the subset can have, or 0 outside it (exact once listed, or when ``x``
        is too close to the subset's edge to test)."""
        if self._listed is None:
            if x >= self.full.w.size or self.full.w[x] == 0.0:
                return 0.0, 0.0  # (no weight: no probability, inside or not)
            inside = self._known.get(x)
            if inside is None:
                inside = self._known[x] = self._inside(x)
            if inside is False:
                return 0.0, 0.0
            if inside:
                w = float(self.full.w[x])
                return w / self.mass[1], w / self.mass[0]
        p = self.prob(x)
        return p, p

    def sample(self, rng: np.random.Generator) -> int:
        # Exact: every try that ends the loop with a draw y does so with probability
        # proportional to the subset's p(y), and every try that goes on (or gives up and
        # samples the listed subset) does so on a draw outside it, so the result is p
        # restricted to the subset.
        if self._listed is None:
            for _ in range(self.TRIES):
                y = self.full.sample(rng)
                inside = self._inside(y)
                if inside is None:  # (listing reuses the weights `full` samples from)
                    inside = self.listed().prob(y) > 0.0
                    return y if inside else self._listed.sample(rng)
                if inside:
                    self._known[y] = True  # (a draft's token: its bounds are free)
                    return y
        return self.listed().sample(rng)

    def dense(self) -> np.ndarray:
        return self.listed().dense()


class Pending:
    """A distribution known by bounds on its probabilities until a value or a draw is asked;
    then built once (``resolve()``) and answered from that.

    The rejection test only needs ``u * q(x) < p(x)``: bounds on ``p(x)`` decide it unless
    ``u`` falls between them (:func:`edgespec.core.rejection.verify` asks them first).
    """

    __slots__ = ("n", "_bounds", "_resolve", "_dist")

    def __init__(self, n: int, bounds, resolve) -> None:
        """``bounds(x)``: ``(lo, hi)`` around ``prob(x)`` as the resolved form gives it;
        ``resolve()``: the distribution itself."""
        self.n = n
        self._bounds = bounds
        self._resolve = resolve
        self._dist = None

    def resolved(self):
        """The distribution itself (built on the first call)."""
        if self._dist is None:
            self._dist = self._resolve()
            self._bounds = self._resolve = None  # (they hold the row)
        return self._dist

    def prob_bounds(self, x: int) -> tuple[float, float]:
        if self._dist is None:
            return self._bounds(x)
        p = self._dist.prob(x)
        return p, p

    def prob(self, x: int) -> float:
        return self.resolved().prob(x)

    def sample(self, rng: np.random.Generator) -> int:
        return self.resolved().sample(rng)

    def dense(self) -> np.ndarray:
        return self.resolved().dense()


class Exact:
    """A dense float64 probability vector (the reference form), as a :class:`Dist`."""

    __slots__ = ("probs", "n")

    def __init__(self, probs: np.ndarray) -> None:
        self.probs = probs
        self.n = probs.size

    def prob(self, x: int) -> float:
        return float(self.probs[x])

    def sample(self, rng: np.random.Generator) -> int:
        return sample(self.probs, rng)

    def dense(self) -> np.ndarray:
        return self.probs


AnyDist = Union[OneHot, Sparse, Dense, Truncated, Pending, Exact]


def block_sums(w: np.ndarray) -> np.ndarray:
    """Sums of float32 weights per block of :data:`BLOCK` (``w``'s length is a multiple of it).

    A matrix-vector product (BLAS) sums the blocks ~9x faster than a float64 reduction. Its
    float32 sums are off by ~1e-7 of a block's mass; :meth:`Dense.sample` picks a block by
    these sums, then a token within it by the block's exact float64 running sum.
    """
    return (w.reshape(-1, BLOCK) @ _ONES).astype(np.float64)


def as_dist(p) -> AnyDist:
    """A :class:`Dist` for a dense probability vector; a Dist is returned as is."""
    return Exact(p) if isinstance(p, np.ndarray) else p


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id from a processed distribution (inverse-CDF on one uniform)."""
    cdf = np.cumsum(probs)
    u = rng.random() * cdf[-1]
    idx = int(np.searchsorted(cdf, u, side="right"))
    # Guard against u landing on the (rounded) end of the CDF.
    idx = min(idx, probs.size - 1)
    while probs[idx] == 0.0 and idx > 0:
        idx -= 1
    return idx
