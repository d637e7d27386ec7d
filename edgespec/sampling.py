"""Sampling settings as processed distributions (Leviathan et al. 2023, section 2.2).

Temperature, top-k, top-p, min-p and greedy are all "sample from an adjusted distribution":
``process`` turns raw logits into that distribution, and draft and target always go through the
same ``process`` with the same settings, so the exact rejection test in :mod:`edgespec.rejection`
sees the distributions that are really sampled from.

Order of processing (the Hugging Face / vLLM order): temperature, then top-k, then top-p, then
min-p, renormalising once at the end. Greedy (temperature 0) is the one-hot distribution on the
arg-max; ties go to the lowest token id, for draft and target alike.

This module is pure NumPy: it imports nothing from llama_cpp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .config import DEFAULT_MIN_P, DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P
from .errors import ConfigError, LogitsError

#: top-p first looks among this many most likely tokens: partitioning is O(V), a full sort of a
#: 152k vocabulary is not. If the nucleus is larger, it falls back to the full sort (same result).
_TOP_P_CANDIDATES = 1024


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are sampled. ``temperature=0`` is greedy decoding.

    ``top_k=0``, ``top_p=1.0`` and ``min_p=0.0`` disable those filters. ``seed`` makes a run
    reproducible (the same seed and settings give the same text); ``None`` draws fresh entropy.
    """

    temperature: float = DEFAULT_TEMPERATURE
    top_k: int = DEFAULT_TOP_K
    top_p: float = DEFAULT_TOP_P
    min_p: float = DEFAULT_MIN_P
    seed: int | None = None

    def __post_init__(self) -> None:
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


def make_rng(seed: int | None) -> np.random.Generator:
    """The engine's one random generator; seeded runs are reproducible."""
    return np.random.default_rng(seed)


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

    probs = np.exp((x - top) / params.temperature)
    probs /= probs.sum()
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
