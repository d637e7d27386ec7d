"""The speculative decoding loop: a round is propose -> score -> judge -> commit.

Invariant between rounds: the target's KV cache holds every committed token but the last one.
A round feeds ``[last committed token] + drafts`` in one call and reads k + 1 rows of logits:
row i scores draft i, the last row gives the bonus token. After the verdict the cache is cut
back to the accepted prefix on the next round's ``sync`` (the invariant again).

:class:`Speculator` holds one generation and does each step of a round: :meth:`~Speculator.propose`
asks the source (or the constraint, for tokens it forces) for a :class:`Plan`;
:meth:`~Speculator.score` runs the target's call (or finishes one launched earlier);
:meth:`~Speculator.judge` is the exact rejection sampler's :class:`Verdict`;
:meth:`~Speculator.commit` extends the text and yields a :class:`Round`, and
:meth:`~Speculator.learn` tells the source what its round did. Two drivers play the steps:
:func:`play` one after another (the CPU, where the decode is the work), :func:`play_ahead`
with the next round's call launched before this round is yielded (a GPU, RPC workers: what
the caller does with a round runs while the device computes).

The loop only needs ``sync`` / ``decode`` from the target, so unit tests drive it with
scripted fakes, and the real engine with :class:`edgespec.runtime.backend.LlamaBackend`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Iterator, NamedTuple, Protocol, Sequence

import numpy as np

from ..core.costs import CallCosts, Clock
from ..core.dist import AnyDist
from ..core.rejection import Source, verify, verify_greedy
from ..core.sampling import SamplingParams, distribution, pending_distribution
from ..core.speedup import CallMeter
from ..core.stats import Stats
from .cache import Follower
from .capabilities import capabilities
from .guide import Guide, log_probs
from .sources import Draft, Drafter, Outcome
from .sources.base import as_drafter


class Target(Protocol):
    n_ctx: int
    tokens: list[int]

    def sync(self, prefix: Sequence[int]) -> int: ...

    def decode(self, tokens: Sequence[int], n_logits: int) -> np.ndarray: ...

    # What more it can do, it declares (:mod:`edgespec.runtime.capabilities`): ``argmax``
    # (greedy rounds then read the target's picks only, all a greedy verdict needs) and
    # ``asynchronous`` (the next round is launched before this one is yielded: :func:`play_ahead`).


@dataclass(frozen=True)
class Generation:
    """One generation's settings, the same for all its rounds.

    ``draft_length``: the most tokens a round drafts. ``max_new_tokens`` only caps how much is
    drafted: a round never drafts past the budget. ``costs``: the target's call costs as
    calibrated; every call is added to ``stats.calls`` (:class:`~edgespec.core.speedup.CallMeter`:
    the evidence of the same-moment speedup). ``clock`` times the rounds (tests pass a
    simulated one). ``guide`` (:class:`~edgespec.runtime.guide.Guide`): bias, penalties, a
    constraint, or log-probabilities."""

    params: SamplingParams
    draft_length: int
    max_new_tokens: int | None = None
    costs: CallCosts | None = None
    clock: Clock = time.perf_counter
    guide: Guide | None = None


class Plan(NamedTuple):
    """The next round as proposed: the source's draft, the tokens to score (cut to the budget
    and to what a constraint allows) with their distributions, the seconds spent drafting and
    on the target's side so far, whether its call is launched, and whether the source assured
    that the round after it is a plain step (``plain_next``)."""

    draft: Draft | None
    tokens: list[int]
    q: list
    t_draft: float
    t_target: float = 0.0
    launched: bool = False
    assured: bool = False


class Verdict(NamedTuple):
    """What the sampler kept: the accepted drafts, the token after them and its source, the
    target's output (rows or picks) and the seconds the round took on the target's side."""

    accepted: int
    token: int
    source: Source
    out: object
    t_target: float
    t_judge: float


@dataclass(frozen=True)
class Round:
    """Tokens one verification round emitted, with where each came from."""

    tokens: list[int]
    sources: list[Source]
    drafter: str
    drafted: int
    accepted: int
    #: per token, its log-probability and top alternatives (when the guide asks for them)
    logprobs: list | None = None


class _ProcessedRows:
    """Target rows processed on first access: rows after a rejection are never computed.

    A row that scores a draft is made :func:`~edgespec.core.sampling.pending_distribution`
    (the test usually decides from bounds, with no pass of ``exp`` over it); the last row is
    always sampled (the bonus token, or the plain step's token) and is processed at once.
    With a guide, row i is shaped for the position after the round's first i drafts."""

    def __init__(self, logits: np.ndarray, params: SamplingParams, guide: Guide | None = None,
                 tokens: Sequence[int] = ()) -> None:
        self._logits = logits
        self._params = params
        self._guide = guide
        self._tokens = tokens
        self._rows: dict[int, AnyDist] = {}

    def __len__(self) -> int:
        return self._logits.shape[0]

    def __getitem__(self, i: int) -> AnyDist:
        row = self._rows.get(i)
        if row is None:
            make = distribution if i == len(self) - 1 else pending_distribution
            if self._guide is None:
                row = self._rows[i] = make(self._logits[i], self._params)
            else:
                row = self._rows[i] = self._guide.distribution(make, self._logits[i],
                                                               self._tokens[:i])
        return row


class _NoBonus:
    """A call's rows that judge all of its ``k`` drafts and have no row after them: the
    sampler's row k, read only where every draft stood, is a stand-in whose token is dropped
    (the round goes on with its next call, whose first row is that position's)."""

    _STAND_IN = np.ones(1)

    def __init__(self, rows, k: int) -> None:
        self._rows, self._k = rows, k

    def __len__(self) -> int:
        return self._k + 1

    def __getitem__(self, i: int):
        return self._rows[i] if i < self._k else self._STAND_IN


def prefill(target: Target, prompt: Sequence[int]) -> int:
    """Bring the target's cache to ``prompt[:-1]``; return how many tokens were already cached."""
    cached = target.sync(prompt[:-1])
    if cached < len(prompt) - 1:
        target.decode(prompt[cached:-1], 0)
    return cached


class Speculator:
    """One generation's rounds, step by step (see the module's note for the steps).

    On a GPU a plain step costs ~2 ms, and what Python does between two decodes runs in the
    cold caches a decode leaves, where each call or object made costs several µs: so the
    per-round work is kept to what a round needs (e.g. a greedy plain step makes no verdict).

    With a guide the rows are shaped per position, so the target's picks are not used. With a
    constraint, every proposal is cut to what the constraint allows before it is scored, and
    where the constraint forces tokens (and the source ``drafts`` at all) those are the round's
    draft, source ``forced``: the source is not asked, nor told (``auto`` learns from its own
    rounds only). A drafting round's rows at positions the constraint leaves one token are not
    read (``unread_rows``: no output projection for them)."""

    def __init__(self, target: Target, drafter: Drafter, prompt: Sequence[int],
                 gen: Generation, rng: np.random.Generator, stats: Stats) -> None:
        self.target, self.gen, self.rng, self.stats = target, gen, rng, stats
        self.drafter = drafter = as_drafter(drafter)
        self.committed = list(prompt)
        self.emitted = 0
        self.clock = gen.clock
        guide = gen.guide
        caps = capabilities(target)
        self.ahead = caps.asynchronous
        self._cache = Follower(target)
        self._meter = CallMeter(gen.costs, stats.calls)
        self._picks = gen.params.greedy and caps.argmax and guide is None
        self._guide = guide
        constrained = guide is not None and guide.constrained
        if guide is not None:
            guide.begin(self.committed)
        self._forcing = constrained and drafter.drafts
        self._skip_rows = constrained and caps.unread_rows and guide.logprobs is None
        self._assures = self.ahead and not constrained  # (plain_next is asked)
        self._is_eog = getattr(target, "is_eog", None)
        #: whether the source learns from its rounds (an Outcome costs µs a round: made only then)
        self._learns = type(drafter).observe is not Drafter.observe or "observe" in vars(drafter)
        # the longest draft: the generation's and the source's. A target with recurrent
        # layers takes back only what its last call holds (``draft_reach`` tokens): the CPU's
        # driver then plays a longer round in calls that each judge reach + 1 drafts
        # (:meth:`in_calls`); the asynchronous one, whose round is one call, drafts no more.
        reach = caps.draft_reach
        #: drafts one call may judge where a round is split into calls (None: never)
        self.per_call: int | None = reach + 1 if reach and not self.ahead else None
        caps_k = [drafter.max_length, reach if self.per_call is None else None]
        self._k = min([gen.draft_length, *(cap for cap in caps_k if cap is not None)])
        self.n_ctx = target.n_ctx
        self._max_new = gen.max_new_tokens
        self._t_scored = 0.0  #: when the last call's output was in hand (the verdict's start)

    @property
    def room(self) -> bool:
        """Whether the context has room for another round."""
        return len(self.committed) < self.n_ctx

    # ---- propose ---------------------------------------------------------------------------

    def _budget(self) -> int:
        """The most tokens this round may draft: [last] + k drafts need len(committed) + k
        cells; capping one lower also keeps the emitted length at exactly n_ctx for every
        source (plain decoding stops there too); never past ``max_new_tokens``."""
        k = min(self._k, self.n_ctx - len(self.committed) - 1)
        if self._max_new is not None:
            k = min(k, max(self._max_new - self.emitted - 1, 0))
        return k

    def _ask(self, k: int) -> Draft | None:
        """The constraint's forced tokens, else the source's proposal."""
        if self._forcing and k > 0:
            forced = self._guide.forced()[:k]
            if forced:
                return Draft(forced, [None] * len(forced), "forced")
        return self.drafter.propose(self.committed, k, self.gen.params, self.rng) if k > 0 else None

    def propose(self) -> Plan:
        """The next round: its draft, cut to the budget and to what a constraint allows."""
        k = self._budget()
        t0 = self.clock()
        draft = self._ask(k)
        tokens = draft.tokens[:k] if draft else []
        if self._guide is not None and tokens:
            tokens = tokens[:self._guide.valid(tokens)]
        q = draft.q[: len(tokens)] if draft else []
        assured = (self._assures and not tokens
                   and self.drafter.plain_next(self.gen.draft_length))
        return Plan(draft, tokens, q, self.clock() - t0, 0.0, False, assured)

    def propose_behind(self, plan: Plan) -> Plan:
        """The source's bookkeeping for a plain step already launched (:meth:`launch_plain`),
        made while the device computes: the round stays plain, and nothing waited for it
        (no drafting time)."""
        draft = self._ask(self._budget())
        return plan._replace(draft=draft,
                             assured=self._assures and self.drafter.plain_next(self.gen.draft_length))

    # ---- score -----------------------------------------------------------------------------

    def launch(self, plan: Plan) -> Plan:
        """Bring the cache to the plan and start its call (an asynchronous target)."""
        t1 = self.clock()
        self._cache.sync(self.committed, len(self.committed) - 1)
        self.target.start_decode([self.committed[-1], *plan.tokens], len(plan.tokens) + 1,
                                 picks=self._picks)
        return plan._replace(t_target=plan.t_target + self.clock() - t1, launched=True)

    def launch_plain(self) -> Plan:
        """Start a plain step the source assured, before its work on it."""
        return self.launch(Plan(None, [], [], 0.0))

    def score(self, plan: Plan, *, bonus: bool = True) -> tuple[object, float]:
        """The target's output for the plan's call, its picks or its rows (finishing a launched
        call), and the round's seconds on the target's side. Without ``bonus`` the call stops
        before the last draft: its rows judge every draft and none follows them."""
        t = self.clock()
        n = len(plan.tokens) + 1 if bonus else len(plan.tokens)
        if plan.launched:
            out = self.target.finish_decode()
        else:
            self._cache.sync(self.committed, len(self.committed) - 1)
            call = [self.committed[-1], *plan.tokens[:n - 1]]
            if self._picks:
                out = self.target.decode_argmax(call, n)
            elif self._skip_rows and plan.tokens:  # rows a constraint settles need no logits
                settled = self._guide.settled(plan.tokens)
                out = self.target.decode(call, n, [i for i in settled if i < n])
            else:
                out = self.target.decode(call, n)
        self._t_scored = end = self.clock()
        t_target = plan.t_target + end - t
        self._meter.add(n, t_target)
        return out, t_target

    def finish(self) -> None:
        """Wait for a launched call whose round nobody will take."""
        self.target.finish_decode()

    # ---- judge -----------------------------------------------------------------------------

    def judge(self, plan: Plan, out: object, t_target: float, *, bonus: bool = True) -> Verdict:
        """The exact sampler's verdict on the plan's drafts (a greedy plain step takes the
        target's pick: no verdict is made). Without ``bonus`` (:meth:`score`'s) a verdict that
        keeps every draft has no token after them (-1)."""
        t = self._t_scored
        tokens = plan.tokens
        if self._picks:
            if not tokens:
                return Verdict(0, int(out[0]), Source.TARGET, out, t_target, self.clock() - t)
            v = verify_greedy(tokens, out if bonus else [*out, -1])
        else:
            rows = _ProcessedRows(out, self.gen.params, self._guide, tokens)
            v = verify(tokens, plan.q, rows if bonus else _NoBonus(rows, len(tokens)), self.rng)
            if not bonus and v.n_accepted == len(tokens):
                v = replace(v, next_token=-1)
        return Verdict(v.n_accepted, v.next_token, v.next_source, out, t_target,
                       self.clock() - t)

    # ---- commit ----------------------------------------------------------------------------

    def commit(self, plan: Plan, verdict: Verdict) -> Round:
        """Extend the text by the round's tokens; the round as the caller gets it."""
        accepted = verdict.accepted
        new = plan.tokens[:accepted] + ([verdict.token] if verdict.token >= 0 else [])
        logprobs = None
        guide = self._guide
        if guide is not None:
            if guide.logprobs is not None:
                logprobs = [log_probs(verdict.out[j], new[j], guide.logprobs)
                            for j in range(len(new))]
            guide.commit(new)
        self.committed.extend(new)
        self.emitted += len(new)
        name = plan.draft.source if plan.draft and plan.tokens else "none"
        self.stats.record_round(name, len(plan.tokens), accepted, plan.t_draft,
                                verdict.t_target, verdict.t_judge)
        return Round(new, [Source.DRAFT] * accepted + [verdict.source] * (len(new) - accepted),
                     name, len(plan.tokens), accepted, logprobs)

    def learn(self, plan: Plan, rnd: Round, t_target: float) -> None:
        """Tell the source what its round did (not a round the constraint forced)."""
        draft = plan.draft
        if self._learns and (draft is None or draft.source != "forced"):
            self.drafter.observe(Outcome(draft, rnd.drafted, rnd.accepted, rnd.tokens,
                                         plan.t_draft, t_target))

    def goes_on(self, rnd: Round) -> bool:
        """Whether the round after ``rnd`` will be asked for: room and budget left, and no
        end-of-generation token committed (an asynchronous driver launches it ahead)."""
        if not self.room:
            return False
        if self._max_new is not None and self.emitted >= self._max_new:
            return False
        is_eog = self._is_eog
        if is_eog is None:
            return True
        return not (any(map(is_eog, rnd.tokens)) if rnd.accepted else is_eog(rnd.tokens[-1]))


def in_calls(spec: Speculator, plan: Plan) -> Iterator[Round]:
    """A round longer than one call can take back (a target with recurrent layers on the CPU's
    pieces: ``spec.per_call``), played as calls that each judge ``per_call`` drafts from
    ``[last] + all but the last of them``, the next call made only where they all stood, the
    last call as any round's (its bonus row included). The rejection test reads the drafts in
    order, and no bonus is drawn between calls, so this is the one round's test, stopped where
    it stops; each call's rejected drafts lie inside it, where the snapshots reach. Each call
    is a :class:`Round` of its own as the caller and the stats see it; the source learns once,
    from the whole round."""
    per, done, t_total = spec.per_call, 0, 0.0
    tokens, q, sources = plan.tokens, plan.q, []
    new: list[int] = []
    while True:
        last = len(tokens) - done < per
        part = plan._replace(tokens=tokens[done:done + per], q=q[done:done + per],
                             t_draft=plan.t_draft if not done else 0.0)
        out, t_target = spec.score(part, bonus=last)
        rnd = spec.commit(part, spec.judge(part, out, t_target, bonus=last))
        t_total += t_target
        new += rnd.tokens
        sources += rnd.sources
        done += len(part.tokens)
        stop = last or rnd.accepted < len(part.tokens) or not spec.goes_on(rnd)
        if stop:
            whole = Round(new, sources, rnd.drafter, len(tokens),
                          sum(s is Source.DRAFT for s in sources))
            spec.learn(plan, whole, t_total)
            yield rnd
            return
        yield rnd


def play(spec: Speculator) -> Iterator[Round]:
    """Rounds one step after another, until the context is full (the caller stops on anything
    else): on the CPU the decode is the work, and launching it before the yield would only
    delay each round's text."""
    committed, n_ctx, per_call = spec.committed, spec.n_ctx, spec.per_call
    while len(committed) < n_ctx:
        plan = spec.propose()
        if per_call is not None and len(plan.tokens) >= per_call:
            yield from in_calls(spec, plan)
            continue
        out, t_target = spec.score(plan)
        verdict = spec.judge(plan, out, t_target)
        rnd = spec.commit(plan, verdict)
        spec.learn(plan, rnd, t_target)
        yield rnd


def play_ahead(spec: Speculator) -> Iterator[Round]:
    """Rounds with the next round proposed and its call launched before this one is yielded,
    so that what the caller does with a round (text, streaming, the UI) runs while the device
    computes. The next round depends on nothing the caller decides, only on the tokens
    committed. A round the caller never takes is waited for when the generator is closed, and
    its tokens are left in the target's cache record (the next ``sync`` cuts them off).

    Where the source assured that the step after a plain one is plain too (``plain_next``:
    ``auto`` where no offer could pay), that step is launched as soon as this one is
    committed, and the source's work on it (learning from this round, its proposal) runs while
    the device computes: a GPU's plain steps under ``auto`` then cost what ``none``'s do.
    A failure while preparing the next round is raised once this round is delivered."""
    pending: Plan | None = None
    try:
        while spec.room:
            plan = pending if pending is not None else spec.launch(spec.propose())
            pending = None
            out, t_target = spec.score(plan)
            rnd = spec.commit(plan, spec.judge(plan, out, t_target))
            failure = None
            going = spec.goes_on(rnd)
            if going and plan.assured:
                try:
                    pending = spec.launch_plain()
                except Exception as err:
                    failure, going = err, False
            spec.learn(plan, rnd, t_target)
            if going:
                try:
                    pending = (spec.propose_behind(pending) if pending is not None
                               else spec.launch(spec.propose()))
                except Exception as err:  # (a launched plain step is still finished on close)
                    failure = err
            yield rnd
            if failure is not None:
                raise failure
    finally:
        if pending is not None and pending.launched:
            spec.finish()


def rounds(target: Target, drafter: Drafter, prompt: Sequence[int], params: SamplingParams,
           rng: np.random.Generator, draft_length: int, stats: Stats,
           max_new_tokens: int | None = None, costs: CallCosts | None = None,
           clock: Clock | None = None, guide: Guide | None = None) -> Iterator[Round]:
    """Yield verification rounds until the context is full, by the driver the target's
    capabilities call for; the generation's settings given one by one (the engine builds a
    :class:`Generation` and calls :func:`speculate`)."""
    gen = Generation(params, draft_length, max_new_tokens, costs, clock or time.perf_counter,
                     guide)
    return speculate(target, drafter, prompt, gen, rng, stats)


def speculate(target: Target, drafter: Drafter, prompt: Sequence[int], gen: Generation,
              rng: np.random.Generator, stats: Stats) -> Iterator[Round]:
    """One generation's rounds: :func:`play_ahead` on an asynchronous target, else :func:`play`."""
    spec = Speculator(target, drafter, prompt, gen, rng, stats)
    return play_ahead(spec) if spec.ahead else play(spec)
