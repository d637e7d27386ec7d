"""The cost-aware choice behind the ``auto`` drafter: which source drafts, and how many tokens.

Every round, for each source s (prompt lookup, the draft model) and each k, the expected rate is

    rate(s, k) = E[tokens | alpha_s, k] / (t(k + 1) + cost_s(k)),   E = (1 - a^(k+1)) / (1 - a)

(Leviathan et al. 2023, sections 3.3-3.5, with the *measured* target curve t instead of their
linear cost model), and plain decoding is ``1 / t(1)``. The best rate wins; drafting must beat
plain decoding by a small margin, so that noise in the estimates does not buy losing bets.

Acceptance rates are learned online per source (for lookup, per matched n-gram length) as a
geometric maximum-likelihood estimate with a prior and exponential forgetting. A lookup draft
is a chain: each accepted token lengthens the match by one, so its later tokens are judged by
the estimates of longer n-grams (:meth:`Policy.lookup_expected`). Pure arithmetic: no model,
no llama_cpp.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..config import DEFAULT_MAX_NGRAM
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

    def reach(self) -> float:
        """The most :attr:`alpha` can be after one more :meth:`update` of a round that tests
        at most one draft (a plain step's shadow): none, one success, or one failure (which,
        after many failures, forgetting can raise)."""
        w, p = self.prior_weight, self.prior
        s, f = self.successes * DECAY, self.failures * DECAY
        return max(self.alpha, (s + 1.0 + w * p) / (s + f + 1.0 + w),
                   (s + w * p) / (s + f + 1.0 + w))

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


def replays_graph(shape, last_shape: int | None, last_run: int):
    """Whether a call of ``shape`` (a width, or an array of them) runs a replayed CUDA graph
    after ``last_run`` calls of width ``last_shape``: only as the third or later of its width
    in a row (the vendored llama.cpp captures on the second). Any other call pays the curve's
    switch penalty."""
    return (shape == last_shape) & (last_run >= 2)


def settle_charge(penalty: float, last_shape: int | None, last_run: int,
                  back: float = 0.0) -> float:
    """Penalties plain decoding still pays from here until its calls replay a graph: none once
    two plain calls ran in a row, one after a single plain call (its second call captures the
    graph), two after any other width (a call without a graph, then the capture); with the
    return penalty ``back`` (:attr:`~edgespec.core.costs.CostCurve.return_penalty`) wherever
    the capture is still to come."""
    if last_shape == 1 and last_run >= 2:
        return 0.0
    if last_shape == 1 and last_run == 1:
        return penalty + back
    return 2.0 * penalty + back


def switch_charges(penalty: float, n: int, last_shape: int | None,
                   last_run: int, back: float = 0.0) -> tuple[np.ndarray, float]:
    """Extra seconds a round of k = 1 .. n drafts costs on a target whose calls pay ``penalty``
    unless they are the third or later of their width in a row (CUDA graphs in the vendored
    llama.cpp: one graph per context, captured on the second call of a width and replayed
    from the third), after ``last_run`` calls of width ``last_shape``, as two parts:

    - its own call (array over k): P unless it continues a settled run of its width k + 1;
      where it is the second of its width it captures that width's graph, and pays the
      return penalty ``back`` R too (a capture of a wide graph cost 2-10 ms more than a call
      without one on the 2026-11-28 H100);
    - the way back (one number): the round leaves plain decoding two penalties and R to
      settle (a call of a new width, then the capture), where plain decoding now would
      have left :func:`settle_charge`. A drafting stretch pays it once, when it ends.

    From steady plain decoding a lone draft round adds 3P + R; within a settled stretch, the
    same width adds nothing and another width P."""
    shapes = counts_upto(n + 1, start=2)
    own = penalty * ~replays_graph(shapes, last_shape, last_run)
    if back and last_run == 1 and last_shape is not None and 2 <= last_shape <= n + 1:
        own[last_shape - 2] += back  # (the round at the last call's width captures)
    return own, 2.0 * penalty + back - settle_charge(penalty, last_shape, last_run, back)


def entry_charge(penalty: float, last_shape: int | None, last_run: int,
                 back: float = 0.0) -> float:
    """What :func:`switch_charges` charges a round of any k from plain decoding or the
    prefill (``last_shape`` 1 or None), as one number: its own call is of a new width (P) and
    it adds the way back. The scalar that :meth:`Policy.choose`'s bound needs, without arrays."""
    return 3.0 * penalty + back - settle_charge(penalty, last_shape, last_run, back)


#: Prior of how often the draft model's next drafting round is its own rather than lookup's
#: (:attr:`Policy.model_goes_on`). In ``scripts/gpu/replay.py`` of the 2026-11-28 H100's
#: exact mode (12 seeds of timing noise) 0.0, 0.5 and 0.8 gave 2.02x, 2.04x and 2.04x of
#: ``none``; the middle one.
MODEL_GOES_ON = 0.5

#: Rounds one rating of the draft model serves while its inputs stay the same
#: (:meth:`Policy._rated_model`).
MODEL_REUSE = 8

#: A source is set aside when its rounds, with the plain steps they made dearer after them,
#: delivered fewer tokens per second than this fraction of auto's own plain steps.
GUARD_FRACTION = 0.95
#: A source's rounds are judged once they committed this many tokens or took the time of this
#: many steady plain steps (both decayed). Time counts too: a long draft that fails commits one
#: token in the time of ~20 plain steps on a CPU, and waiting for 24 tokens let such rounds
#: run an answer at 0.7x of plain decoding (32-token lookup drafts, 66 drafted, 1 right).
GUARD_EVIDENCE = 24.0
#: Rounds a source judged losing sits out; doubled each time it is judged losing again in a
#: row, up to GUARD_BAN_MAX, and back to GUARD_BAN once it is judged paying.
GUARD_BAN = 32
GUARD_BAN_MAX = 1024
#: Plain steps after a drafting round whose extra time (above the steady plain step) is the
#: drafting round's: on a GPU, the first runs without a graph and the second captures one.
SETTLE_ROUNDS = 2


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

    The choice rests on estimates (t(n), the draft's cost, penalties, acceptance); where they
    are wrong on some machine in a way no estimate shows, this sees it in the result. Every
    round records its tokens and seconds (drafting and target call) under its source; the
    extra time of the SETTLE_ROUNDS plain steps after a drafting round, above the steady plain
    step, is charged to that round's source. A source whose rate, over GUARD_EVIDENCE tokens
    or the time of as many plain steps, fell below GUARD_FRACTION of the plain steps' rate sits
    out GUARD_BAN rounds (doubling while it keeps losing), then starts a fresh record.
    """

    plain_prior: float  #: seconds of a plain step before any was seen (the curve's t(1))
    plain: _Tally = field(default_factory=_Tally)
    sources: dict[str, _Tally] = field(default_factory=dict)
    banned_until: dict[str, int] = field(default_factory=dict)
    ban: dict[str, int] = field(default_factory=dict)
    round: int = 0
    _debtor: str | None = None
    _settle_left: int = 0

    def allowed(self, source: str) -> bool:
        return self.round >= self.banned_until.get(source, 0)

    def steady_plain(self) -> float:
        """Seconds of a steady plain step: the record's, else the prior."""
        if self.plain.tokens < 4:
            return self.plain_prior
        return self.plain.seconds / self.plain.tokens

    def record(self, source: str, tokens: int, seconds: float) -> None:
        """One round: ``source`` ("none" for a plain step), tokens committed, seconds spent."""
        self.round += 1
        if source == "none":
            if self._settle_left and self._debtor is not None:
                self._settle_left -= 1
                debt = max(seconds - self.steady_plain(), 0.0)
                seconds -= debt
                if self.allowed(self._debtor):  # (else it was just set aside: no more to say)
                    self.sources[self._debtor].add(0, debt, 1.0)
                    self._judge(self._debtor, settled=not self._settle_left)
            self.plain.add(tokens, seconds, DECAY)
            return
        self.sources.setdefault(source, _Tally()).add(tokens, seconds, DECAY)
        self._debtor, self._settle_left = source, SETTLE_ROUNDS
        self._judge(source, settled=False)

    def _judge(self, source: str, settled: bool) -> None:
        """Set ``source`` aside if its record is losing. It is only cleared of past bans on a
        settled record (its last round's dearer plain steps charged): before them every
        drafting round looks better than it is, and clearing there, where a record of rounds
        near break-even often crosses, kept its bans at the shortest while it lost."""
        tally = self.sources[source]
        plain_rate = 1.0 / self.steady_plain()
        if tally.tokens < GUARD_EVIDENCE and tally.seconds * plain_rate < GUARD_EVIDENCE:
            return
        if tally.rate >= plain_rate:
            if settled:
                self.ban.pop(source, None)
        elif tally.rate < GUARD_FRACTION * plain_rate:
            last = self.ban.get(source)
            ban = self.ban[source] = GUARD_BAN if last is None else min(2 * last, GUARD_BAN_MAX)
            self.banned_until[source] = self.round + ban
            self.sources[source] = _Tally()


def _chain_total(young: list[float], k_max: int) -> float:
    """Expected tokens of a lookup draft of ``k_max`` tokens whose drafts meet the estimates
    ``young`` in turn, the last of them for the rest: a few scalar steps and a geometric tail."""
    reached = total = 1.0
    for a in young:
        reached *= a
        total += reached
    rest = k_max - len(young)
    if rest > 0:
        a = young[-1]
        total += reached * (rest if a >= 1.0 else a * (1.0 - a ** rest) / (1.0 - a))
    return total


def _chain_array(young: list[float], k_max: int) -> np.ndarray:
    """:meth:`Policy.lookup_expected` from the estimates :meth:`Policy._chain` gathered."""
    alphas = np.empty(k_max)
    alphas[:len(young)] = young
    alphas[len(young):] = young[-1]
    np.cumprod(alphas, out=alphas)
    np.cumsum(alphas, out=alphas)
    alphas += 1.0
    return alphas


def _most_model_rate(alpha: float, base: float, per_token: float, k_max: int) -> float:
    """An upper bound on a draft-model round's rate E(alpha, k) / (base + k per_token) over
    k = 1 .. ``k_max`` (``base``: no more than the round's target call and penalties). E is
    at most min(k + 1, 1 / (1 - alpha)), and that over a line in k only rises then falls (or
    only falls), so the bound is its value at k = 1 or where k + 1 reaches 1 / (1 - alpha).
    The longest draft's tokens over one drafted token's time, the bound before, let the
    model's prior (0.6) look like paying on the 2026-11-28 H100's calibration (0.51 against
    a floor of 0.50 tokens/ms) where no k came near (0.32 at best)."""
    cap = 1.0 / (1.0 - alpha) if alpha < 1.0 else float(k_max + 1)
    k = min(max(cap - 1.0, 1.0), float(k_max))
    return max(min(2.0, cap) / (base + per_token), min(k + 1.0, cap) / (base + k * per_token))


def _share(continue_rate: float) -> float:
    """The part of a stretch's once-paid penalties (entry, capture, way back) that one lookup
    round is charged: 1 - ``continue_rate`` (how often a lookup round had a lookup draft to go
    on with in the round after it, lately), so over the stretch's expected length."""
    return 1.0 - continue_rate


def _rated_behind(behind: int, wide: bool) -> int:
    """What a rating takes ``behind`` as: itself for a short catch-up (a call per token), the
    power of two at or below it for a wide one (see :meth:`Policy._model_key`)."""
    return 1 << (max(behind, 1).bit_length() - 1) if wide else behind


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
    #: the longest n-gram lookup matches: where a draft's chain of estimates ends
    max_ngram: int = DEFAULT_MAX_NGRAM
    #: seconds a draft model's wide catch-up (one call reading several tokens the text gained
    #: since it last drafted) costs beyond what the target's curve says of its width: on a
    #: GPU, the call and the two after it run without the draft context's CUDA graph
    #: (:meth:`catch_up_cost`, learned by :meth:`observe_catch_up`)
    wide_catch_up: CostEstimate = field(default_factory=lambda: CostEstimate(0.0))
    #: how often the draft model's next drafting round was its own rather than lookup's
    #: (plain steps between them do not count), as :meth:`catch_up_cost` charges a short
    #: catch-up
    model_goes_on: AcceptanceEstimate = field(
        default_factory=lambda: AcceptanceEstimate(MODEL_GOES_ON))
    #: the draft model's last rating: (its inputs, rounds it may still serve, (k, rate))
    _model_option: tuple | None = field(default=None, repr=False, compare=False)

    def lookup_estimate(self, ngram: int) -> AcceptanceEstimate:
        est = self.lookup.get(ngram)
        if est is None:
            est = self.lookup[ngram] = self._fresh_lookup_estimate(ngram)
        return est

    def _fresh_lookup_estimate(self, ngram: int) -> AcceptanceEstimate:
        """An estimate for n-gram size ``ngram`` before any evidence: at its prior."""
        lo, hi = self.lookup_prior
        return AcceptanceEstimate(lo + (hi - lo) * min(max(ngram - 1, 0), 3) / 3)

    def lookup_expected(self, ngram: int, k_max: int) -> np.ndarray:
        """Expected tokens of a lookup round of k = 1 .. ``k_max`` drafts (index k - 1) from a
        match of ``ngram`` tokens. Draft i (from 0) is only reached if the drafts before it
        were right, and then the match is ``ngram + i`` tokens long; so it is accepted with the
        estimate for that n-gram size (up to ``max_ngram``, where lookup's matches stop
        growing): E(k) = 1 + sum over i < k of the product of a(min(ngram + j, cap)), j <= i.

        One estimate for the whole draft (the n-gram it started from) undervalues a young
        match that keeps on: in an edit, a copy that has run two tokens is rated like every
        two-token match, though each token it gets right makes it a longer, surer one."""
        if k_max <= 0:
            return np.empty(0)
        return _chain_array(self._chain(ngram, k_max)[0], k_max)

    def _chain(self, ngram: int, k_max: int) -> tuple[list[float], float]:
        """The estimates a draft of ``k_max`` tokens from a match of ``ngram`` meets while its
        match grows (the last of them, the cap's, goes on for the rest), and the draft's
        expected tokens E(k_max) as one number: a few scalar steps and a geometric tail, for
        the bound that most rounds with an offer stop at (the arrays cost ~5 µs more)."""
        cap = max(self.max_ngram, ngram)
        last = min(cap, ngram + k_max - 1)
        young = [self.lookup_estimate(n).alpha for n in range(ngram, last + 1)]
        return young, _chain_total(young, k_max)

    def observe_lookup(self, ngram: int, matched: int, rejected: bool) -> None:
        """A lookup proposal from a match of ``ngram`` tokens had its first ``matched`` tokens
        confirmed (then one refuted, if ``rejected``): each token is evidence for the n-gram
        size the match had when it was reached, as :meth:`lookup_expected` rates it. One
        update per size and round (forgetting goes by rounds, as for every estimate)."""
        cap = max(self.max_ngram, ngram)
        young = min(matched, cap - ngram)  # confirmed tokens reached before the match's cap
        for i in range(young):
            self.lookup_estimate(ngram + i).update(1, False)
        refuted_at = min(ngram + matched, cap)
        if matched > young or refuted_at == cap and rejected:
            self.lookup_estimate(cap).update(matched - young, rejected and refuted_at == cap)
        if rejected and refuted_at < cap:
            self.lookup_estimate(refuted_at).update(0, True)

    def choose(self, k_max: int, lookup_len: int = 0, lookup_ngram: int = 0, *,
               probe: bool = False, longer_than: int = 0, last_shape: int | None = None,
               last_run: int = 2, continue_rate: float = 0.0, lookup: bool = True,
               model: bool = True, behind: int = 1, wide: bool = False) -> Choice:
        """Best (source, k) for this round. ``lookup_len``: tokens the lookup match offers.

        ``last_shape``: the width of the previous target call, made ``last_run`` times in a
        row. With a switch penalty P (a GPU), a round is charged what it adds in penalties
        (:func:`switch_charges`): a call pays P unless it is at least the third of its width
        in a row (llama.cpp's CUDA backend runs the first of a new width without a graph and
        captures one on the second), and plain decoding pays again to settle after drafting,
        plus the curve's return penalty R (what a lone round cost beyond that on the device:
        ~5 ms on the 2026-11-28 H100, where 3P was ~4 ms). Entering a stretch of drafting
        rounds and leaving it are shared by its rounds: a lookup round from plain decoding is charged them times (1 - ``continue_rate``), the
        chance that the round after it has no lookup draft to go on with, so over the
        stretch's expected length, and so is the graph's capture on a stretch's second round;
        a change of width within a stretch is charged in full. The chance is what happened
        after lookup rounds lately, not how often lookup offers at all: in generated code
        (an SQL schema's repeated column lines) lookup offers in most plain steps, yet the
        round after a lookup round that broke off seldom has a draft, and rounds charged by
        the offer rate ran 3P dearer each with no stretch after them (0.89x of ``none`` on
        that prompt in ``scripts/gpu/replay.py``, against 1.01x). A draft model can always go
        on: its rounds are charged their own calls and not the way back. So a lone lookup
        round from steady plain decoding costs 3P + R, a stretch of copying that goes on enters
        at little cost and keeps its k, and plain decoding is rated at its steady cost.

        ``lookup``, ``model``: whether each source may draft this round (:class:`Realized`).
        ``behind``: tokens the draft model must read before it drafts (1 when it drafted the
        round before and a draft was refused, 2 when all passed), in one call if ``wide``; a
        model round is charged :meth:`catch_up_cost` for them.

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
        n_lookup = min(k_max, lookup_len) if lookup else 0
        n_model = k_max if model and self.draft_cost is not None and not probe else 0
        entering = last_shape is None or last_shape == 1  # a round from plain decoding
        chain = self._chain(lookup_ngram, n_lookup) if n_lookup > longer_than else None
        rate_lookup = chain is not None and self._lookup_may_pay(
            n_lookup, chain[1], entering, floor, last_shape, last_run, continue_rate)
        model_key = (self._model_key(n_model, last_shape, last_run, behind, wide) if n_model
                     else None)
        rated = self._rated_model(model_key)
        catch_up = 0.0
        if rated is None and n_model:
            catch_up = self.catch_up_cost(_rated_behind(behind, wide), wide)
            if not self._model_may_pay(n_model, floor, last_shape, last_run, catch_up):
                rated = (0, 0.0)  # no k can beat plain decoding: a rating that never wins
                self._model_option = (model_key, MODEL_REUSE - 1, rated)
        if not rate_lookup and (not n_model or rated is not None):
            if rated is not None and rated[1] > floor:
                best = Choice("model", rated[0], rated[1], baseline)
            return best
        n = max(n_lookup, n_model)
        times = t.table(n + 1)[2:]  # times[k - 1] = t(k + 1): a round of k drafts
        own, back = np.zeros(n), 0.0
        if t.switch_penalty and not t.width:  # (a fixed width has one shape)
            own, back = switch_charges(t.switch_penalty, n, last_shape, last_run,
                                       t.return_penalty)
        if rate_lookup:
            # entering a stretch, capturing its graph and leaving it are paid once: amortised
            # over its expected length; a change of width within one is paid in full (else
            # the width would flap with every small change of the estimates, paying each time)
            once = _share(continue_rate)
            if entering:
                switches = (own[:n_lookup] + back) * once
            else:
                shapes = counts_upto(n_lookup + 1, start=2)
                switches = own[:n_lookup] * np.where(shapes == last_shape, once, 1.0) + back * once
            rates = (_chain_array(chain[0], n_lookup)
                     / (times[:n_lookup] + switches + self.lookup_cost.seconds))
            rates[:longer_than] = -np.inf
            k = int(rates.argmax())
            if rates[k] > floor:
                best = Choice("lookup", k + 1, float(rates[k]), baseline)
        if n_model:
            if rated is None:
                rates = (expected_tokens_upto(self.model.alpha, n_model)
                         / (times[:n_model] + own[:n_model] + catch_up
                            + self.draft_cost.seconds * counts_upto(n_model, start=1)))
                k = int(rates.argmax())
                rated = (k + 1, float(rates[k]))
                self._model_option = (model_key, MODEL_REUSE - 1, rated)
            if rated[1] > max(best.rate if best.k else 0.0, floor):
                best = Choice("model", rated[0], rated[1], baseline)
        return best

    def _lookup_may_pay(self, n: int, most: float, entering: bool, floor: float,
                        last_shape: int | None, last_run: int, continue_rate: float) -> bool:
        """False where no lookup draft of 1 .. n tokens can rate above ``floor``, by a bound
        that costs ~3 µs: the most tokens any of them promises (``most``, the longest's) over
        the least time any of them takes. Rating every k over arrays costs ~20 µs, in every
        round that lookup offers a draft; on a GPU those are mostly rounds from plain decoding
        whose entry costs 3P, where the bound says no."""
        t = self.curve
        least = max(t.lower_bound(2, n + 1), 1e-6) + self.lookup_cost.seconds
        penalty = t.switch_penalty if not t.width else 0.0
        if penalty and entering:  # every k pays the same entry
            least += entry_charge(penalty, last_shape, last_run,
                                  t.return_penalty) * _share(continue_rate)
        # (a hair of slack: the arrays' float rounding must never decide against the bound)
        return most / least > floor * (1.0 - 1e-9)

    def _model_may_pay(self, n: int, floor: float, last_shape: int | None,
                       last_run: int, catch_up: float = 0.0) -> bool:
        """False where no draft-model round of 1 .. n tokens can rate above ``floor``
        (:func:`_most_model_rate`, with the curve's least t over their widths and the switch
        penalty where none of their widths would replay a graph). Rating every k costs 20-50
        µs in the loop (the curve's row, the penalties, the expected tokens: cold arrays after
        a decode), and on a GPU the model loses from plain decoding at its prior acceptance,
        so this is most of the rounds that rate it."""
        t = self.curve
        least = max(t.lower_bound(2, n + 1), 1e-6) + catch_up
        if t.switch_penalty and not t.width and not (
                last_shape is not None and 2 <= last_shape <= n + 1 and last_run >= 2):
            least += t.switch_penalty
        return _most_model_rate(self.model.alpha, least, self.draft_cost.seconds,
                                n) > floor * (1.0 - 1e-9)

    def _model_key(self, n: int, last_shape: int | None, last_run: int,
                   behind: int = 1, wide: bool = False) -> tuple:
        """The inputs a rating of the draft model for drafts of up to ``n`` tokens rests on
        (:meth:`_rated_model`): a run of 2 or more calls of one width replays alike, and a
        wide catch-up is rated by the power of two at or below its tokens (what the model
        must read grows by one every plain step; the rating errs toward trying it)."""
        return (self.model.alpha, self.draft_cost.seconds, n, last_shape, min(last_run, 2),
                _rated_behind(behind, wide), wide, self.wide_catch_up.seconds,
                self.model_goes_on.alpha)

    def catch_up_cost(self, behind: int, wide: bool) -> float:
        """Seconds a draft-model round costs beyond one call per drafted token when the model
        must first read ``behind`` tokens (1: in step, it feeds only the last one): a call
        each (``wide`` False: a GPU's short catch-up goes a token a call, on a replayed
        graph), or one call for them all, priced like the target's call of that width
        against its single one, plus :attr:`wide_catch_up`.

        A short catch-up (after a round whose drafts all passed, or a few plain steps) is
        charged only for the part of the time that a lookup round came before the model's
        next one (1 - :attr:`model_goes_on`): plain decoding does not save those calls, the
        model owes them (and one more a step) whenever it drafts next, and only a lookup
        round, after which it reads them with the rest in one wide call, does. Charged in
        full, they made a model that paid in step lose to plain decoding right after its
        best rounds, and then sit out a chat answer (1.04x of ``none`` in
        ``scripts/gpu/replay.py`` of the 2026-11-28 H100's exact mode, where the ``model``
        drafter ran 1.19x; 1.18x so). A wide one is charged in full: charging it in part
        let the model take rounds from lookup in edits (worst prompt 0.99x against 1.00x)."""
        if behind <= 1 or self.draft_cost is None:
            return 0.0
        if not wide:
            return self.draft_cost.seconds * (behind - 1) * (1.0 - self.model_goes_on.alpha)
        return self._wide_price(behind) + self.wide_catch_up.seconds

    def _wide_price(self, behind: int) -> float:
        """What one call reading ``behind`` tokens costs beyond a single-token call, by the
        target curve's shape."""
        t = self.curve
        return self.draft_cost.seconds * max(t(behind) / t(1) - 1.0, 0.0)

    def observe_catch_up(self, behind: int, wide: bool, seconds: float) -> None:
        """A draft-model round that first read ``behind`` tokens (in one call if ``wide``)
        cost ``seconds`` beyond one call per drafted token: what a wide one cost beyond its
        width's price feeds :attr:`wide_catch_up`."""
        if wide and behind > 1 and self.draft_cost is not None:
            self.wide_catch_up.observe(seconds - self._wide_price(behind))

    def _rated_model(self, key: tuple | None) -> tuple[int, float] | None:
        """The draft model's last (best k, rate), if it may serve this round. Its inputs change
        only when it drafts (acceptance and cost) or the calls' shapes change, and the curve
        drifts slowly; so one rating serves up to MODEL_REUSE rounds with the same inputs. In
        the plain steps where the model is not chosen (all of them, on a GPU with this pair)
        that is most of a choice's work saved."""
        cached = self._model_option
        if key is None or cached is None or cached[0] != key or cached[1] <= 0:
            return None
        self._model_option = (key, cached[1] - 1, cached[2])
        return cached[2]

    def model_declines(self, k_max: int, last_shape: int | None = None,
                       last_run: int = 2, behind: int = 1, wide: bool = False) -> bool:
        """Whether :meth:`choose`, with no lookup offer, would decline the draft model on its
        last rating (one of its MODEL_REUSE rounds, used up as ``choose`` would). False where
        no rating serves: then ``choose`` must rate it. What ``auto`` asks first in a round
        with nothing else to draft, for the price of a key (~10 µs less than a choice)."""
        if self.draft_cost is None or k_max <= 0:
            return True
        rated = self._rated_model(self._model_key(k_max, last_shape, last_run, behind, wide))
        return rated is not None and rated[1] <= (1.0 + MARGIN) / self.curve(1)

    def plain_assured(self, k_max: int, *, run: int, continue_rate: float, lookup: bool,
                      model: bool, moved: int = 0) -> bool:
        """Whether :meth:`choose` will pick plain decoding in a round from plain decoding (after
        ``run`` plain calls in a row) for any lookup offer of up to ``k_max`` tokens from a
        match of any size, once one more plain step is observed: that step moves at most the
        acceptance estimate of n-gram size ``moved`` (its lookup proposal's; 0: none), by one
        success or failure (:meth:`AcceptanceEstimate.reach`), and lookup's cost (its next
        sample at most zero). Then an asynchronous target's loop may launch that round before
        the drafter's work on it
        (:meth:`edgespec.runtime.drafters.AutoDrafter.plain_next`). False says nothing.

        The step moves t(1) too, by a fraction of its time (CostCurve.observe's running
        average); t(1) is taken as it is: a choice it would flip is a near tie of drafting
        and plain decoding, where playing either costs about the same.

        The bounds are :meth:`_lookup_may_pay`'s and :meth:`_model_may_pay`'s at ``k_max``
        (their ratio of tokens to time grows with k), with the largest chain of estimates
        that any match size meets."""
        t = self.curve
        if k_max <= 0:
            return True
        floor, least, penalty = self._from_plain(k_max)
        if model and self.draft_cost is not None:
            cached = self._model_option
            if cached is not None and cached[2][1] > floor:
                return False  # a rating that may still serve and would win
            if _most_model_rate(self.model.alpha, least + penalty, self.draft_cost.seconds,
                                k_max) > floor:
                return False
        if not lookup:
            return True
        cap = max(self.max_ngram, 1)
        alphas = []
        for n in range(1, cap + 1):  # (sizes not seen yet at their priors, not added)
            est = self.lookup.get(n) or self._fresh_lookup_estimate(n)
            alphas.append(est.reach() if n == moved else est.alpha)
        # (as _chain does for a match of each size)
        most = max(_chain_total(alphas[ngram - 1:min(cap, ngram + k_max - 1)], k_max)
                   for ngram in range(1, cap + 1))
        if penalty:
            least += entry_charge(penalty, 1, run, t.return_penalty) * _share(continue_rate)
        least += self.lookup_cost.seconds * (1.0 - self.lookup_cost.weight)
        return most / least <= floor

    def retrial_may_pay(self, k_max: int) -> bool:
        """Whether a re-trial of the draft model (its acceptance forgotten: at its prior) could
        rate it above plain decoding from steady plain decoding, by :meth:`plain_assured`'s
        bound. On a GPU in llama.cpp's default kernels it cannot (the prior's 0.6 promises
        too little for the draft's price), and a re-trial due then need not keep the loop
        from launching the step ahead."""
        if self.draft_cost is None or k_max <= 0:
            return False
        floor, least, penalty = self._from_plain(k_max)
        return _most_model_rate(self.model.prior, least + penalty, self.draft_cost.seconds,
                                k_max) > floor

    def _from_plain(self, k_max: int) -> tuple[float, float, float]:
        """The bounds of a round of up to ``k_max`` drafts from steady plain decoding: the rate
        it must beat (with a hair of slack for float rounding), the least t over its widths,
        and the switch penalty its call pays (0 at a fixed width: one shape)."""
        t = self.curve
        penalty = t.switch_penalty if not t.width else 0.0
        return ((1.0 + MARGIN) / t(1) * (1.0 - 1e-9), max(t.lower_bound(2, k_max + 1), 1e-6),
                penalty)

    def model_can_pay(self, k_max: int) -> bool:
        """Whether the draft model could beat plain decoding even if it were always right."""
        if self.draft_cost is None or k_max <= 0:
            return False
        times = self.curve.table(k_max + 1)
        k = counts_upto(k_max, start=1)
        return bool(np.any((k + 1.0) / (times[2:] + k * self.draft_cost.seconds) > 1.0 / times[1]))
