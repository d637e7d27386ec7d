"""The speculative decoding loop: draft, score in one batch, verify, repeat.

Invariant between rounds: the target's KV cache holds every committed token but the last one.
A round feeds ``[last committed token] + drafts`` in one call and reads k + 1 rows of logits:
row i scores draft i, the last row gives the bonus token. After the verdict the cache is cut
back to the accepted prefix on the next round's ``sync`` (the invariant again).

The loop only needs ``sync`` / ``decode`` from the target, so unit tests drive it with
scripted fakes, and the real engine with :class:`edgespec.runtime.backend.LlamaBackend`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
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
from .drafters import Draft, Drafter, Outcome
from .guide import Guide, log_probs


class Target(Protocol):
    n_ctx: int
    tokens: list[int]

    def sync(self, prefix: Sequence[int]) -> int: ...

    def decode(self, tokens: Sequence[int], n_logits: int) -> np.ndarray: ...

    # What more it can do, it declares (:mod:`edgespec.runtime.capabilities`): ``argmax``
    # (greedy rounds then read the target's picks only, all a greedy verdict needs) and
    # ``asynchronous`` (the next round is launched before this one is yielded: :func:`rounds`).


class Plan(NamedTuple):
    """The next round, proposed and (on an asynchronous target) launched: what it drafts, the
    seconds spent drafting and on the target's side so far, and whether the drafter assured
    that the round after it is a plain step (``plain_next``)."""

    draft: Draft | None
    tokens: list[int]
    q: list
    t_draft: float
    t_target: float
    assured: bool


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


def prefill(target: Target, prompt: Sequence[int]) -> int:
    """Bring the target's cache to ``prompt[:-1]``; return how many tokens were already cached."""
    cached = target.sync(prompt[:-1])
    if cached < len(prompt) - 1:
        target.decode(prompt[cached:-1], 0)
    return cached


def rounds(
    target: Target,
    drafter: Drafter,
    prompt: Sequence[int],
    params: SamplingParams,
    rng: np.random.Generator,
    draft_length: int,
    stats: Stats,
    max_new_tokens: int | None = None,
    costs: CallCosts | None = None,
    clock: Clock | None = None,
    guide: Guide | None = None,
) -> Iterator[Round]:
    """Yield verification rounds until the context is full (the caller stops on anything else).

    ``max_new_tokens`` only caps how much is drafted: a round never drafts past the budget.
    ``costs``: the target's call costs as calibrated; every call is added to ``stats.calls``
    (:class:`~edgespec.core.speedup.CallMeter`: the evidence of the same-moment speedup). ``clock``: what times the rounds (``time.perf_counter``; tests pass a simulated one).

    On a GPU a plain step costs ~2 ms, and what Python does between two decodes runs in the
    cold caches a decode leaves, where each call or object made costs several µs (10-15 µs
    for a dataclass on this project's CPU VM): so the per-round work is kept to what a round
    needs, e.g. a greedy plain step makes no verdict.

    Where the target's decode is asynchronous (``target.asynchronous``, with ``start_decode``
    and ``finish_decode``: a GPU, RPC workers), the next round is proposed and its call
    launched before this round is yielded, so that what the caller does with a round (text,
    streaming, the UI) runs while the device computes. The next round depends on nothing the
    caller decides, only on the tokens committed. A round the caller never takes is waited for
    when the generator is closed, and its tokens are left in the target's cache record (the
    next ``sync`` cuts them off). On the CPU the decode is the work, and launching it before
    the yield would only delay each round's text.

    A drafter may also say, while a plain step's call runs, that the step after it will be
    plain whatever this one commits (``plain_next(draft_length)``: ``auto`` where no offer
    could pay). That step is then launched as soon as this one is committed, and the
    drafter's work on it (observing this round, its proposal, its choice) runs while the
    device computes: a GPU's plain steps under ``auto`` then cost what ``none``'s do.

    ``guide`` (:class:`~edgespec.runtime.guide.Guide`): bias, penalties, a constraint, or
    log-probabilities. Its rows are shaped per position, so the target's picks are not used.
    With a constraint, every proposal is cut to what the constraint allows before it is
    scored, and where the constraint forces tokens (and the drafter is not ``none``) those
    are the round's draft, source ``forced``: the drafter is not asked, nor told (``auto``
    learns from its own rounds only). A drafting round's rows at positions the constraint
    leaves one token are not read (``unread_rows``: no output projection for them).
    """
    committed = list(prompt)
    cache = Follower(target)
    emitted = 0
    caps = capabilities(target)
    picks = target.decode_argmax if params.greedy and caps.argmax and guide is None else None
    constrained = guide is not None and guide.constrained
    if guide is not None:
        guide.committed = committed
    forcing = constrained and getattr(drafter, "name", "") != "none"
    skip_rows = constrained and caps.unread_rows and guide.logprobs is None
    ahead = caps.asynchronous
    start = target.start_decode if ahead else None
    finish = target.finish_decode if ahead else None
    is_eog = getattr(target, "is_eog", None)
    as_picks = picks is not None
    observe = getattr(drafter, "observe", None)
    plain_next = getattr(drafter, "plain_next", None) if ahead and not constrained else None
    draft_source, target_source = Source.DRAFT, Source.TARGET
    n_ctx = target.n_ctx
    clock = clock or time.perf_counter
    meter = CallMeter(costs, stats.calls)

    def plan(launched: float | None = None) -> Plan:
        """Propose the next round, bring the cache to it and (``ahead``) launch its call.
        ``launched``: the seconds of a plain step already launched (:func:`launch_plain`); the
        proposal is then the drafter's bookkeeping, made while the device computes, and the
        round stays plain (nothing waited for the proposal: no drafting time)."""
        # Feeding [last] + k drafts needs len(committed) + k cells; capping one lower also keeps
        # the emitted length at exactly n_ctx for every drafter (plain decoding stops there too).
        k = min(draft_length, n_ctx - len(committed) - 1)
        if max_new_tokens is not None:
            k = min(k, max(max_new_tokens - emitted - 1, 0))
        t0 = clock()
        draft = None
        if forcing and k > 0:
            forced = guide.forced()[:k]
            if forced:
                draft = Draft(forced, [None] * len(forced), "forced")
        if draft is None:
            draft = drafter.propose(committed, k, params, rng) if k > 0 else None
        if launched is not None:
            return Plan(draft, [], [], 0.0, launched, bool(plain_next(draft_length)))
        tokens = draft.tokens[:k] if draft else []
        if guide is not None and tokens:
            tokens = tokens[:guide.valid(tokens)]
        q = draft.q[: len(tokens)] if draft else []
        t1 = clock()
        cache.sync(committed, len(committed) - 1)
        if ahead:
            start([committed[-1], *tokens], len(tokens) + 1, picks=as_picks)
        return Plan(draft, tokens, q, t1 - t0, clock() - t1, bool(
            plain_next is not None and not tokens and plain_next(draft_length)))

    def launch_plain() -> float:
        """Launch a plain step the drafter assured (before its work on it); its seconds."""
        t1 = clock()
        cache.sync(committed, len(committed) - 1)
        start([committed[-1]], 1, picks=as_picks)
        return clock() - t1

    pending = None
    try:
        while len(committed) < n_ctx:
            if pending is None:
                pending = plan()
            draft, tokens, q, t_draft, t_target, assured = pending
            pending = None
            t2 = clock()
            if picks is not None:
                ids = finish() if ahead else picks([committed[-1], *tokens], len(tokens) + 1)
                t3 = clock()
                if tokens:
                    verdict = verify_greedy(tokens, ids)
                    accepted, token, source = verdict.n_accepted, verdict.next_token, verdict.next_source
                else:  # a greedy plain step: the target's pick (no verdict made; see rounds' note)
                    accepted, token, source = 0, int(ids[0]), target_source
            else:
                if ahead:
                    logits = finish()
                elif skip_rows and tokens:  # rows a constraint settles need no logits
                    logits = target.decode([committed[-1], *tokens], len(tokens) + 1,
                                           guide.settled(tokens))
                else:
                    logits = target.decode([committed[-1], *tokens], len(tokens) + 1)
                t3 = clock()
                verdict = verify(tokens, q, _ProcessedRows(logits, params, guide, tokens), rng)
                accepted, token, source = verdict.n_accepted, verdict.next_token, verdict.next_source
            t4 = clock()
            t_target += t3 - t2
            meter.add(len(tokens) + 1, t_target)

            new = tokens[:accepted] + [token]
            logprobs = None
            if guide is not None:
                if guide.logprobs is not None:
                    logprobs = [log_probs(logits[j], new[j], guide.logprobs)
                                for j in range(len(new))]
                guide.commit(new)
            committed.extend(new)
            emitted += len(new)
            failure = None
            goes_on = ahead and len(committed) < n_ctx and (
                max_new_tokens is None or emitted < max_new_tokens) and not (
                is_eog is not None and (any(map(is_eog, new)) if accepted else is_eog(token)))
            launched = None
            if goes_on and assured:
                # the drafter said this step is plain whatever it commits: launched first, so
                # that its observing and proposing run while the device computes
                try:
                    launched = launch_plain()
                except Exception as err:
                    failure, goes_on = err, False
            if observe is not None and not (draft is not None and draft.source == "forced"):
                observe(Outcome(draft, len(tokens), accepted, new, t_draft, t_target))
            if goes_on:
                if launched is not None:  # (finished on close even if proposing fails)
                    pending = Plan(None, [], [], 0.0, launched, False)
                try:
                    pending = plan(launched)
                except Exception as err:  # raised once this round is delivered
                    failure = err
            # (from here on, on an asynchronous target, the device computes the next round)
            name = draft.source if draft and tokens else "none"
            sources = [draft_source] * accepted + [source]
            stats.record_round(name, len(tokens), accepted, t_draft, t_target, t4 - t3)
            yield Round(new, sources, name, len(tokens), accepted, logprobs)
            if failure is not None:
                raise failure
    finally:
        if pending is not None:  # a launched call whose round nobody will take
            finish()
