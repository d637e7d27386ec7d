"""The cost-aware choice behind the ``auto`` drafter: which source drafts, and how many tokens.

Every round, for each source s (prompt lookup, the draft model) and each k, the expected rate is

    rate(s, k) = E[tokens | alpha_s, k] / (t(k + 1) + cost_s(k)),   E = (1 - a^(k+1)) / (1 - a)

(Leviathan et al. 2023, sections 3.3-3.5, with the *measured* target curve t instead of their
linear cost model), and plain decoding is ``1 / t(1)``. The best rate wins; drafting must beat
plain decoding by a small margin, so that noise in the estimates does not buy losing bets.

Acceptance rates are learned online per source (for lookup, per matched n-gram length) as a
geometric maximum-likelihood estimate with a prior and exponential forgetting. Pure arithmetic:
no model, no llama_cpp.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .costs import CostCurve, counts_upto, expected_tokens_upto

#: Drafting must promise this much more than plain decoding before it is chosen.
MARGIN = 0.03

#: A cost probe plays lookup even when it is predicted to lose by up to this fraction of plain
#: decoding's rate, to re-measure t(k + 1) (see :meth:`Policy.choose`).
PROBE_SLACK = 0.25

#: Old evidence fades by this factor per observation, so estimates follow the text's mood
#: (a code block that is being copied, then free prose) within a few dozen rounds.
DECAY = 0.95


@dataclass
class AcceptanceEstimate:
    """Per-token acceptance probability from (accepted run, rejected?) observations.

    Under independent per-token acceptance a, a round that accepts j drafts and then rejects one
    contributes j successes and one failure; a round whose drafts all pass contributes only
    successes. The estimate is successes / (successes + failures), with ``prior_weight``
    pseudo-observations at ``prior``.
    """

    prior: float
    prior_weight: float = 2.0
    successes: float = 0.0
    failures: float = 0.0

    def update(self, accepted: int, rejected: bool) -> None:
        self.successes = DECAY * self.successes + accepted
        self.failures = DECAY * self.failures + (1.0 if rejected else 0.0)

    @property
    def alpha(self) -> float:
        w = self.prior_weight
        return (self.successes + w * self.prior) / (self.successes + self.failures + w)

    @property
    def evidence(self) -> float:
        return self.successes + self.failures


@dataclass(frozen=True)
class Choice:
    """What to do this round: draft ``k`` tokens from ``source`` (``none`` and k = 0: plain step)."""

    source: str
    k: int
    rate: float  #: expected tokens per second
    baseline: float  #: plain decoding's tokens per second under the same cost curve


@dataclass
class CostEstimate:
    """Running mean of a per-call or per-token cost in seconds."""

    seconds: float
    weight: float = 0.2

    def observe(self, seconds: float) -> None:
        self.seconds += self.weight * (seconds - self.seconds)


@dataclass
class Policy:
    """Online estimates plus the arg-max rule. One per generation (acceptance depends on the
    text); the cost curve is shared by the engine across generations."""

    curve: CostCurve
    draft_cost: CostEstimate | None = None  #: seconds per draft-model token; None: no model
    lookup_cost: CostEstimate = field(default_factory=lambda: CostEstimate(2e-4))
    model: AcceptanceEstimate = field(default_factory=lambda: AcceptanceEstimate(0.6))
    lookup: dict[int, AcceptanceEstimate] = field(default_factory=dict)
    #: prior for lookup by matched n-gram length: longer matches are likelier to continue
    lookup_prior: tuple[float, float] = (0.4, 0.7)  #: (at n-gram 1, at n-gram >= 4)

    def lookup_estimate(self, ngram: int) -> AcceptanceEstimate:
        est = self.lookup.get(ngram)
        if est is None:
            lo, hi = self.lookup_prior
            prior = lo + (hi - lo) * min(max(ngram - 1, 0), 3) / 3
            est = self.lookup[ngram] = AcceptanceEstimate(prior)
        return est

    def choose(self, k_max: int, lookup_len: int = 0, lookup_ngram: int = 0, *,
               probe: bool = False, longer_than: int = 0, last_shape: int | None = None) -> Choice:
        """Best (source, k) for this round. ``lookup_len``: tokens the lookup match offers.

        ``last_shape``: the width of the previous target call. A round whose call has another
        shape also pays the curve's switch penalty (on a GPU, a call without a replayed graph),
        so drafting keeps its k while it pays, and a lone draft round must win by more. Plain
        decoding is rated at its steady cost: what going back to it costs once is spread over
        the plain steps that follow.

        ``probe``: the best lookup option longer than ``longer_than`` tokens, even if it is
        predicted to be up to PROBE_SLACK slower than plain decoding. The curve only learns the
        t(n) that are played: a too optimistic t(n) is corrected by playing it, a pessimistic
        one would never be, and it is longer drafts that a pessimistic curve forbids. A probe
        now and then costs a fraction of one round. The draft model is never probed this way
        (its prefill is dear; it has its own re-trial).

        Every k is rated at once over arrays (a few µs), not in a Python loop over k (~3 µs per
        k and source: ~100 µs a round at k_max 32, 5% of a GPU token); ties go to the shorter
        draft.
        """
        t = self.curve
        baseline = 1.0 / t(1)
        best = Choice("none", 0, baseline, baseline)
        if k_max <= 0:
            return best
        floor = baseline * (1.0 - PROBE_SLACK if probe else 1.0 + MARGIN)
        n_lookup = min(k_max, lookup_len)
        n_model = k_max if self.draft_cost is not None and not probe else 0
        if n_lookup <= longer_than and not n_model:
            return best
        n = max(n_lookup, n_model)
        times = t.table(n + 1)[2:]  # times[k - 1] = t(k + 1): a round of k drafts
        if t.switch_penalty:
            shapes = t.width or counts_upto(n + 1, start=2)  # a fixed width: one shape
            times = times + t.switch_penalty * (shapes != last_shape)
        if n_lookup > longer_than:
            rates = (expected_tokens_upto(self.lookup_estimate(lookup_ngram).alpha, n_lookup)
                     / (times[:n_lookup] + self.lookup_cost.seconds))
            rates[:longer_than] = -np.inf
            k = int(rates.argmax())
            if rates[k] > floor:
                best = Choice("lookup", k + 1, float(rates[k]), baseline)
        if n_model:
            c = self.draft_cost.seconds
            rates = (expected_tokens_upto(self.model.alpha, n_model)
                     / (times[:n_model] + c * counts_upto(n_model, start=1)))
            k = int(rates.argmax())
            if rates[k] > max(best.rate if best.k else 0.0, floor):
                best = Choice("model", k + 1, float(rates[k]), baseline)
        return best

    def model_can_pay(self, k_max: int) -> bool:
        """Whether the draft model could beat plain decoding even if it were always right."""
        if self.draft_cost is None or k_max <= 0:
            return False
        times = self.curve.table(k_max + 1)
        k = counts_upto(k_max, start=1)
        return bool(np.any((k + 1.0) / (times[2:] + k * self.draft_cost.seconds) > 1.0 / times[1]))
