"""The cost-aware choice behind the ``auto`` drafter: which source drafts, and how many tokens.

The model. Every round, for each source s (prompt lookup, the draft model) and draft length k,
the round's call is w = k + 1 tokens wide and its expected rate is

    rate(s, k) = E_s(k) / (S(w) + c_s(k) + A(w) / R_s + B_s / L_s)
    plain decoding: 1 / (S(1) + A(1) / R_none)

- E_s(k): expected tokens the round commits (Leviathan et al. 2023, section 3.1), from s's
  per-token acceptance, learned online (a geometric estimate with a prior and forgetting; for
  lookup per matched n-gram size, read as a chain: each accepted token lengthens the match).
- S(w): the target's steady time for a call of width w, and c_s(k): what drafting costs (the
  draft model's calls, the tokens it must read first; lookup's host time). Measured, refined
  by every call (:class:`~edgespec.core.costs.CallCosts`).
- A(w), B_s: what calls cost beyond S once, not every round. A device that keeps one captured
  graph per width (llama.cpp's CUDA backend) runs the first call of a new width without a
  graph (U more) and the second captures one (C more); from the third on it replays. So a
  call's width costs A(w) = U + h C if it differs from the last call's (h: the chance that a
  second call of it follows), C if it is the second of its width, nothing once settled; and
  a drafting stretch that starts from plain decoding owes the way back to it, B = U + C. U
  and C are learned from every call (0 on a CPU and at a fixed width).
- R_s and L_s: the rounds those one-time costs are spread over: the expected run of s's rounds
  at one width, 1 / (1 - h), and of s's rounds in a row (its stretch), learned per source as
  how often its round was followed by one of the same source and width (h), and by one of
  the same source (each run capped at ``max_stretch``).

The best rate wins, but what the last round played (plain decoding where it cannot be played
again) stays unless another choice promises ``margin`` more: noise in the estimates must not
buy losing bets, nor flap the width where a new width costs (with graphs; elsewhere only plain
decoding is kept so, and a drafting width follows the best rating). Two rules keep the
estimates honest where the model's inputs are wrong: the draft model's acceptance, learned only when it drafts, is forgotten after
it sat out a while (a re-trial, at waits that double while trials fail); and what each source
actually delivered is kept (:class:`Realized`): one whose rounds gave less than plain steps
sits out, whatever the estimates say. Every tunable is in :class:`PolicyConfig`. Pure
arithmetic: no model, no llama_cpp.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..config import DEFAULT_MAX_NGRAM
from .costs import CallCosts, counts_upto, expected_tokens_upto

SOURCES = ("none", "lookup", "model")


@dataclass(frozen=True)
class PolicyConfig:
    """Every tunable of the policy, with its meaning. Experiments are other configs."""

    #: drafting must promise this much more than plain decoding before it is chosen
    margin: float = 0.03
    #: old evidence fades by this factor per observation, so estimates follow the text's mood
    decay: float = 0.95
    #: pseudo-observations behind each prior
    prior_weight: float = 2.0
    #: the draft model's per-token acceptance before any evidence
    model_prior: float = 0.7
    #: lookup's acceptance before evidence, at a 1-token match and at matches of 4 or more
    lookup_prior: tuple[float, float] = (0.4, 0.7)
    #: how often a round of each source is followed by one of the same source (and by one of
    #: the same source and width), before evidence: (plain decoding, lookup, draft model).
    #: Lookup must first show a stretch (a lone round pays its whole way in and back); the
    #: model can always draft on.
    stretch_prior: tuple[float, float, float] = (0.9, 0.0, 0.9)
    #: pseudo-observations behind the stretch priors
    stretch_weight: float = 8.0
    #: the longest stretch (rounds) a one-time cost is spread over
    max_stretch: float = 32.0
    #: rounds without the draft model before its acceptance is forgotten (a re-trial): the
    #: first wait, and the longest (doubling while re-trials keep failing)
    retrial_wait: tuple[int, int] = (8, 64)
    #: a source whose realized rate falls below this fraction of plain steps' sits out
    guard_fraction: float = 0.95
    #: ... judged once its rounds committed this many tokens or took as long as that many
    #: plain steps (decayed)
    guard_evidence: float = 24.0
    #: ... for this many rounds, doubling while it keeps losing, up to the second number
    guard_ban: tuple[int, int] = (32, 1024)


DEFAULT_CONFIG = PolicyConfig()


@dataclass
class AcceptanceEstimate:
    """Per-token acceptance probability from (accepted run, rejected?) observations.

    Under independent per-token acceptance a, a round that accepts j drafts and then rejects one
    contributes j successes and one failure; a round whose drafts all pass contributes only
    successes. The estimate is successes / (successes + failures), with ``prior_weight``
    pseudo-observations at ``prior``; old evidence fades by ``decay`` per update.
    """

    prior: float
    prior_weight: float = 2.0
    successes: float = 0.0
    failures: float = 0.0
    decay: float = DEFAULT_CONFIG.decay

    def update(self, accepted: float, rejected: bool) -> None:
        self.successes = self.decay * self.successes + accepted
        self.failures = self.decay * self.failures + (1.0 if rejected else 0.0)

    @property
    def alpha(self) -> float:
        w = self.prior_weight
        return (self.successes + w * self.prior) / (self.successes + self.failures + w)

    def reach(self) -> float:
        """The most :attr:`alpha` can be after one more :meth:`update` of at most one success
        or one failure (which, after many failures, forgetting can raise)."""
        w, p = self.prior_weight, self.prior
        s, f = self.successes * self.decay, self.failures * self.decay
        return max(self.alpha, (s + 1.0 + w * p) / (s + f + 1.0 + w),
                   (s + w * p) / (s + f + 1.0 + w))

    def forget(self) -> None:
        self.successes = self.failures = 0.0


@dataclass
class CostEstimate:
    """Running mean of a per-call or per-token cost in seconds."""

    seconds: float
    weight: float = 0.2

    def observe(self, seconds: float) -> None:
        self.seconds += self.weight * (seconds - self.seconds)


@dataclass(frozen=True)
class Offer:
    """What a round may draft: up to ``k_max`` tokens; lookup's proposal (``lookup_len`` tokens
    from a match of ``ngram``); whether the draft model may draft, and what it must read first
    (``behind`` tokens, in one call if ``wide``, else a call each)."""

    k_max: int
    lookup_len: int = 0
    ngram: int = 0
    model: bool = True
    behind: int = 1
    wide: bool = False


@dataclass(frozen=True)
class Choice:
    """What to do this round: draft ``k`` tokens from ``source`` (``none`` and k = 0: plain step)."""

    source: str
    k: int
    rate: float  #: expected tokens per second
    baseline: float  #: plain decoding's tokens per second from here


@dataclass(frozen=True)
class RoundOutcome:
    """What one round did, as the policy learns from it."""

    source: str  #: "none", "lookup" or "model" (what drafted; "none" when nothing was scored)
    width: int  #: the target call's width
    drafted: int
    accepted: int
    committed: int  #: tokens the round committed
    t_target: float  #: seconds of the target's call
    t_draft: float  #: seconds of drafting
    #: lookup's proposal for this round, played or not (a shadow): (its n-gram, its tokens
    #: the round confirmed, whether it saw one refuted); None where it offered nothing
    lookup: tuple[int, int, bool] | None = None
    #: the draft model's steady seconds per drafted token in this round, if it drafted
    draft_step: float | None = None


@dataclass
class _Tally:
    tokens: float = 0.0
    seconds: float = 0.0

    def add(self, tokens: float, seconds: float, decay: float) -> None:
        self.tokens = decay * self.tokens + tokens
        self.seconds = decay * self.seconds + seconds

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Realized:
    """What each way of playing a round actually delivered: the online check on the model.

    Every round records its tokens and seconds under its source; the extra time of the two
    plain steps after a drafting round (above the steady plain step) is its source's too (on a
    GPU those calls pay the way back). A source whose rate, over ``guard_evidence`` tokens or
    the time of as many plain steps, fell below ``guard_fraction`` of the plain steps' rate sits
    out ``guard_ban[0]`` rounds (doubling while it keeps losing), then starts a fresh record.
    """

    plain_prior: float  #: seconds of a plain step before any was seen
    config: PolicyConfig = DEFAULT_CONFIG
    plain: _Tally = field(default_factory=_Tally)
    sources: dict[str, _Tally] = field(default_factory=dict)
    banned_until: dict[str, int] = field(default_factory=dict)
    ban: dict[str, int] = field(default_factory=dict)
    round: int = 0
    _debtor: str | None = None
    _settle_left: int = 0

    def allowed(self, source: str, ahead: int = 0) -> bool:
        """Whether ``source`` may draft ``ahead`` rounds from now."""
        return self.round + ahead >= self.banned_until.get(source, 0)

    def steady_plain(self) -> float:
        if self.plain.tokens < 4:
            return self.plain_prior
        return self.plain.seconds / self.plain.tokens

    def record(self, source: str, tokens: int, seconds: float) -> None:
        """One round: ``source`` ("none" for a plain step), tokens committed, seconds spent."""
        self.round += 1
        decay = self.config.decay
        if source == "none":
            if self._settle_left and self._debtor is not None:
                self._settle_left -= 1
                debt = max(seconds - self.steady_plain(), 0.0)
                seconds -= debt
                if self.allowed(self._debtor):
                    self.sources[self._debtor].add(0, debt, 1.0)
                    self._judge(self._debtor, settled=not self._settle_left)
            self.plain.add(tokens, seconds, decay)
            return
        self.sources.setdefault(source, _Tally()).add(tokens, seconds, decay)
        self._debtor, self._settle_left = source, 2
        self._judge(source, settled=False)

    def _judge(self, source: str, settled: bool) -> None:
        """Set ``source`` aside if its record is losing; clear its past bans only on a settled
        record (its last round's dearer plain steps charged)."""
        cfg = self.config
        tally = self.sources[source]
        plain_rate = 1.0 / self.steady_plain()
        if tally.tokens < cfg.guard_evidence and tally.seconds * plain_rate < cfg.guard_evidence:
            return
        if tally.rate >= plain_rate:
            if settled:
                self.ban.pop(source, None)
        elif tally.rate < cfg.guard_fraction * plain_rate:
            last = self.ban.get(source)
            first, most = cfg.guard_ban
            ban = self.ban[source] = first if last is None else min(2 * last, most)
            self.banned_until[source] = self.round + ban
            self.sources[source] = _Tally()


def _chain_total(young: list[float], k_max: int) -> float:
    """The last of :func:`_chain_array`'s values, in scalar steps and a geometric tail."""
    reached = total = 1.0
    for a in young:
        reached *= a
        total += reached
    rest = k_max - len(young)
    if rest > 0:
        a = young[-1]
        total += reached * (rest if a >= 1.0 else a * (1.0 - a ** rest) / (1.0 - a))
    return total


def _most_model_rate(alpha: float, base: float, per_token: float, k_max: int) -> float:
    """An upper bound on E(alpha, k) / (base + k per_token) over k = 1 .. ``k_max``: E is at
    most min(k + 1, 1 / (1 - alpha)), and that over a line in k only rises then falls, so the
    bound is its value at k = 1 or where k + 1 reaches 1 / (1 - alpha)."""
    cap = 1.0 / (1.0 - alpha) if alpha < 1.0 else float(k_max + 1)
    k = min(max(cap - 1.0, 1.0), float(k_max))
    return max(min(2.0, cap) / (base + per_token), min(k + 1.0, cap) / (base + k * per_token))


def _chain_array(young: list[float], k_max: int) -> np.ndarray:
    """Expected tokens of lookup drafts of k = 1 .. ``k_max`` tokens (index k - 1) whose drafts
    meet the estimates ``young`` in turn, the last of them for the rest."""
    alphas = np.empty(k_max)
    alphas[:len(young)] = young
    alphas[len(young):] = young[-1]
    np.cumprod(alphas, out=alphas)
    np.cumsum(alphas, out=alphas)
    alphas += 1.0
    return alphas


@dataclass
class Policy:
    """Online estimates plus the arg-max rule. One per generation (acceptance depends on the
    text); the call costs are the engine's, shared across generations."""

    costs: CallCosts
    draft_cost: CostEstimate | None = None  #: seconds per draft-model token; None: no model
    config: PolicyConfig = DEFAULT_CONFIG
    #: the longest n-gram lookup matches: where a draft's chain of estimates ends
    max_ngram: int = DEFAULT_MAX_NGRAM
    lookup_cost: CostEstimate = field(default_factory=lambda: CostEstimate(2e-4))
    model: AcceptanceEstimate = field(init=False)
    lookup: dict[int, AcceptanceEstimate] = field(init=False, default_factory=dict)
    #: per source: how often its round was followed by one of the same source (``stretch``),
    #: and by one of the same source and width (``hold``)
    stretch: dict[str, AcceptanceEstimate] = field(init=False)
    hold: dict[str, AcceptanceEstimate] = field(init=False)
    realized: Realized = field(init=False)
    #: the last target call: its width and how many calls of it in a row (None: the prefill)
    last_width: int | None = field(init=False, default=None)
    run: int = field(init=False, default=0)
    _last_source: str | None = field(init=False, default=None)
    _since_model: int = field(init=False, default=0)
    _wait: int = field(init=False)

    def __post_init__(self) -> None:
        cfg = self.config
        self.model = self._estimate(cfg.model_prior)
        self.stretch = {s: self._estimate(p, cfg.stretch_weight)
                        for s, p in zip(SOURCES, cfg.stretch_prior)}
        self.hold = {s: self._estimate(p, cfg.stretch_weight)
                     for s, p in zip(SOURCES, cfg.stretch_prior)}
        self.realized = Realized(self.costs.steady(1), cfg)
        self._wait = cfg.retrial_wait[0]

    def _estimate(self, prior: float, weight: float | None = None) -> AcceptanceEstimate:
        weight = self.config.prior_weight if weight is None else weight
        return AcceptanceEstimate(prior, weight, decay=self.config.decay)

    # ---- the estimates -------------------------------------------------------------------------

    def lookup_estimate(self, ngram: int) -> AcceptanceEstimate:
        est = self.lookup.get(ngram)
        if est is None:
            lo, hi = self.config.lookup_prior
            est = self.lookup[ngram] = self._estimate(lo + (hi - lo) * min(max(ngram - 1, 0), 3) / 3)
        return est

    def lookup_expected(self, ngram: int, k_max: int) -> np.ndarray:
        """E(k) of lookup drafts of k = 1 .. ``k_max`` tokens (index k - 1) from a match of
        ``ngram`` tokens: draft i is only reached if the drafts before it were right, and then
        the match is ``ngram + i`` tokens long, so it is rated by that size's estimate."""
        if k_max <= 0:
            return np.empty(0)
        return _chain_array(self._chain(ngram, k_max), k_max)

    def _chain(self, ngram: int, k_max: int) -> list[float]:
        """The estimates a lookup draft of ``k_max`` tokens from a match of ``ngram`` meets while
        its match grows, up to ``max_ngram`` (whose estimate goes on for the rest)."""
        cap = max(self.max_ngram, ngram)
        last = min(cap, ngram + k_max - 1)
        return [self.lookup_estimate(n).alpha for n in range(ngram, last + 1)]

    def _length(self, estimate: AcceptanceEstimate) -> float:
        return 1.0 / (1.0 - min(estimate.alpha, 1.0 - 1.0 / self.config.max_stretch))

    def stretch_length(self, source: str) -> float:
        """L_s: the rounds of ``source`` in a row expected."""
        return self._length(self.stretch[source])

    def hold_length(self, source: str) -> float:
        """R_s: the rounds of ``source`` at one width in a row expected."""
        return self._length(self.hold[source])

    # ---- the choice ----------------------------------------------------------------------------

    def _once(self, source: str) -> tuple[float, float]:
        """A(w) / R_s + B_s / L_s of rounds of ``source`` from here: (at any width but the last
        call's, at the last call's width)."""
        costs = self.costs
        if not costs.graphs:
            return 0.0, 0.0
        length = self.hold_length(source)
        new = (costs.changed + (1.0 - 1.0 / length) * costs.second) / length
        same = (costs.second if self.run == 1 else 0.0) / length
        if source != "none" and self._last_source in (None, "none"):  # the way back
            back = (costs.changed + costs.second) / self.stretch_length(source)
            new, same = new + back, same + back
        return new, same

    def plain_rate(self) -> float:
        """Plain decoding's rate from here: 1 / (S(1) + A(1) / R_none)."""
        new, same = self._once("none")
        return 1.0 / (self.costs.steady(1) + (same if self.last_width == 1 else new))

    def _per_round(self, source: str, n: int) -> np.ndarray:
        """S(w) + A(w) / R_s + B_s / L_s for rounds of k = 1 .. n drafts of ``source``: a round's
        seconds but for drafting."""
        costs = self.costs
        per_round = costs.steady.table(n + 1)[2:]
        if not costs.graphs:
            return per_round
        new, same = self._once(source)
        per_round = per_round + new
        last = self.last_width
        if last is not None and 2 <= last <= n + 1:
            per_round[last - 2] += same - new
        return per_round

    def _rates(self, source: str, tokens: np.ndarray, drafting: np.ndarray | float) -> np.ndarray:
        """rate(source, k) for k = 1 .. len(tokens), given E(k) and c(k)."""
        return tokens / (self._per_round(source, len(tokens)) + drafting)

    def model_drafting(self, n: int, behind: int = 1, wide: bool = False) -> np.ndarray:
        """c_model(k), k = 1 .. n: a call per drafted token after the first, whose call also
        reads the ``behind`` tokens the model lacks (one call for them all if ``wide``, priced
        by the target curve's shape, else a call each)."""
        d = self.draft_cost.seconds
        if wide and behind > 1:
            steady = self.costs.steady
            first = d * max(steady(behind) / steady(1), 1.0)
        else:
            first = d * max(behind, 1)
        return d * counts_upto(n - 1, start=0) + first

    def _best(self, rates: np.ndarray) -> tuple[int, float]:
        k = int(rates.argmax())
        return k + 1, float(rates[k])

    def choose(self, offer: Offer) -> Choice:
        """Best (source, k) for this round under the model in this module's docstring. What the
        last round played (its source at its width; plain decoding where that cannot be played
        now) stays unless another choice promises ``margin`` more. Without graphs (a CPU, a
        fixed width) a change of width costs nothing, so only plain decoding is kept so: a
        kept width there locks in whatever noise rated best once."""
        plain = self.plain_rate()
        best = incumbent = Choice("none", 0, plain, plain)
        if offer.k_max <= 0:
            return best
        last_k = (self.last_width or 0) - 1
        kept = self._keepable()
        for source, rates in self._options(offer, plain, kept):
            k, rate = self._best(rates)
            if rate > best.rate:
                best = Choice(source, k, rate, plain)
            if source == kept and 1 <= last_k <= len(rates):
                incumbent = Choice(source, last_k, float(rates[last_k - 1]), plain)
        if best.source == incumbent.source and best.k == incumbent.k:
            return best
        return best if best.rate > incumbent.rate * (1.0 + self.config.margin) else incumbent

    def _keepable(self) -> str | None:
        """The source whose last width :meth:`choose` keeps within the margin: the last
        round's, where a change of width costs (graphs); elsewhere none."""
        return self._last_source if self.costs.graphs else None

    def _options(self, offer: Offer, plain: float, kept: str | None):
        """(source, its rates for k = 1 .. n) for each source that may draft this round, but
        for one whose every rate is bound to stay at or below ``plain`` (it can be neither the
        best nor, not being ``kept``, the one kept): most rounds stop at that bound, a few
        scalar steps, where rating every k costs tens of µs."""
        n = min(offer.k_max, offer.lookup_len) if self.realized.allowed("lookup") else 0
        if n:
            chain = self._chain(offer.ngram, n)
            per_round = self._per_round("lookup", n) + self.lookup_cost.seconds
            if (kept == "lookup"
                    or _chain_total(chain, n) / per_round.min() * (1.0 + 1e-9) > plain):
                yield "lookup", _chain_array(chain, n) / per_round
        if self.model_may_draft(offer.model):
            n, alpha = offer.k_max, self.model.alpha
            drafting = self.model_drafting(n, offer.behind, offer.wide)
            if (kept == "model"
                    or self._model_bound(alpha, n, float(drafting[0])) > plain):
                yield "model", (expected_tokens_upto(alpha, n)
                                / (self._per_round("model", n) + drafting))

    def _model_bound(self, alpha: float, n: int, first: float) -> float:
        """No draft-model round of 1 .. n drafts rates above this (``first``: its first drafted
        token's cost, with what it reads first): its least time is no less than the least S
        over its widths, the least one-time cost and the drafting."""
        d = self.draft_cost.seconds
        new, same = self._once("model")
        base = self.costs.steady.lower_bound(2, n + 1) + min(new, same) + first - d
        return _most_model_rate(alpha, base, d, n) * (1.0 + 1e-9)  # (float rounding)

    def model_may_draft(self, offered: bool = True, ahead: int = 0) -> bool:
        return (offered and self.draft_cost is not None
                and self.realized.allowed("model", ahead))

    def plain_assured(self, k_max: int, moved: int = 0) -> bool:
        """Whether the round after the next plain step will be plain too, for any lookup offer
        of up to ``k_max`` tokens from a match of any size and the draft model in step: the same
        rating as :meth:`choose`, with what that step can change at its most favourable to
        drafting (the estimate of n-gram size ``moved``, lookup's shadow, at its
        :meth:`~AcceptanceEstimate.reach`; the excess of its call's relation at its least; a
        re-trial or a ban's end that falls due; lookup's host time at nothing). It moves S(1)
        by a fraction too, which is taken as it is: a choice that would flip is a near tie,
        where either costs about the same.
        An asynchronous loop then launches that round before the drafter's work on it."""
        if k_max <= 0:
            return True
        saved = self.last_width, self.run, self._last_source, self.costs
        self.costs = self.costs.least_after(1, self.last_width, self.run)
        self.last_width, self.run = 1, self.run + 1 if self.last_width == 1 else 1
        self._last_source = "none"
        try:
            floor = self.plain_rate() * (1.0 + self.config.margin)
            if self.model_may_draft(ahead=1):
                alpha = self.model.alpha
                if self._since_model + 1 >= self._wait:  # (a re-trial: at the prior)
                    alpha = max(alpha, self.model.prior)
                if (self._model_bound(alpha, k_max, self.draft_cost.seconds) > floor
                        and (expected_tokens_upto(alpha, k_max) / (
                            self._per_round("model", k_max) + self.model_drafting(k_max))
                             ).max() > floor):
                    return False
            if self.realized.allowed("lookup", ahead=1):
                per_round = self._per_round("lookup", k_max)
                cap = max(self.max_ngram, 1)
                alphas = [self.lookup_estimate(n).reach() if n == moved
                          else self.lookup_estimate(n).alpha for n in range(1, cap + 1)]
                chains = [alphas[ngram - 1:min(cap, ngram + k_max - 1)]  # (as _chain has them)
                          for ngram in range(1, cap + 1)]
                # (no draft of any match can rate above its longest's tokens over the least
                # time: most rounds stop at this bound)
                most = max(_chain_total(c, k_max) for c in chains) / per_round.min()
                if most * (1.0 + 1e-9) > floor:  # (float rounding must not decide)
                    for chain in chains:
                        if (_chain_array(chain, k_max) / per_round).max() > floor:
                            return False
            return True
        finally:
            self.last_width, self.run, self._last_source, self.costs = saved

    def model_can_pay(self, k_max: int) -> bool:
        """Whether the draft model could beat plain decoding even if it were always right, in
        a stretch as long as any."""
        if self.draft_cost is None or k_max <= 0:
            return False
        k = counts_upto(k_max, start=1)
        steady = self.costs.steady.table(k_max + 1)
        per_round = steady[2:] + self.draft_cost.seconds * k + (
            2.0 * (self.costs.changed + self.costs.second) / self.config.max_stretch)
        return bool(np.any((k + 1.0) / per_round > 1.0 / steady[1]))

    # ---- learning ------------------------------------------------------------------------------

    def observe_lookup(self, ngram: int, matched: int, rejected: bool) -> None:
        """A lookup proposal from a match of ``ngram`` tokens had its first ``matched`` tokens
        confirmed (then one refuted, if ``rejected``): each token is evidence for the n-gram
        size the match had when it was reached, as :meth:`_chain` rates it."""
        cap = max(self.max_ngram, ngram)
        young = min(matched, cap - ngram)  # confirmed tokens reached before the match's cap
        for i in range(young):
            self.lookup_estimate(ngram + i).update(1, False)
        refuted_at = min(ngram + matched, cap)
        if matched > young or refuted_at == cap and rejected:
            self.lookup_estimate(cap).update(matched - young, rejected and refuted_at == cap)
        if rejected and refuted_at < cap:
            self.lookup_estimate(refuted_at).update(0, True)

    def observe(self, outcome: RoundOutcome) -> None:
        """Learn from a round: its call's cost, each source's acceptance, how stretches go on,
        what each source delivered, and the draft model's re-trial."""
        source = outcome.source if outcome.drafted else "none"
        width = self.costs.shape(outcome.width)
        self.costs.observe(width, self.last_width, self.run, outcome.t_target)
        last = self._last_source
        if last is not None:
            same = source == last
            self.stretch[last].update(int(same), not same)
            held = same and width == self.last_width
            self.hold[last].update(int(held), not held)
        self._last_source = source
        self.run = self.run + 1 if width == self.last_width else 1
        self.last_width = width
        if outcome.lookup is not None:
            self.observe_lookup(*outcome.lookup)
        self.realized.record(source, outcome.committed, outcome.t_draft + outcome.t_target)
        if source == "model":
            self.model.update(outcome.accepted, outcome.accepted < outcome.drafted)
            if outcome.draft_step is not None and self.draft_cost is not None:
                self.draft_cost.observe(outcome.draft_step)
            self._since_model = 0
            if outcome.accepted == outcome.drafted:
                self._wait = self.config.retrial_wait[0]
            return
        self._since_model += 1
        if self._since_model >= self._wait:  # a re-trial: what the model knew may be stale
            self._since_model = 0
            self._wait = min(2 * self._wait, self.config.retrial_wait[1])
            self.model.forget()
            self.stretch["model"].forget()
            self.hold["model"].forget()
