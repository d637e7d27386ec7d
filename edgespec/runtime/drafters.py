"""Drafters: cheap proposals of the next few tokens, behind one small interface.

A drafter looks at the committed tokens (prompt + generated) and proposes up to ``k`` next
tokens, each with the processed distribution it was sampled from (``None`` for a deterministic,
one-hot proposal). The target then verifies them all in one batched call.

- ``none``: proposes nothing; the loop degenerates to plain autoregressive decoding.
- ``lookup``: prompt-lookup n-gram copying (one-hot proposals, ~free).
- ``model``: an autoregressive GGUF draft model sampled with the same processing as the target.
- ``hybrid``: lookup when it finds a match, else the draft model.
- ``auto``: each round, whichever of plain decoding, lookup or the draft model (and how many
  tokens) maximises the expected tokens per second under the measured costs (see
  :mod:`edgespec.core.policy`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np

from ..config import DEFAULT_MAX_NGRAM, DEFAULT_MIN_NGRAM, DRAFT_WINDOW
from ..core.lookup import LookupMatch, NgramIndex, common_prefix, find_continuation
from ..core.dist import AnyDist
from ..core.policy import Offer, RoundOutcome
from ..core.sampling import SamplingParams, draft_distribution, window_distribution
from ..errors import ConfigError
from .cache import Follower
from .capabilities import capabilities

DRAFTER_NAMES = ("auto", "none", "lookup", "model", "hybrid")

#: Drafters that use the draft model when one is loaded.
MODEL_DRAFTERS = ("auto", "model", "hybrid")


@dataclass
class Draft:
    """Proposed tokens, the distributions they were drawn from, and who proposed them."""

    tokens: list[int] = field(default_factory=list)
    q: list[AnyDist | None] = field(default_factory=list)
    source: str = "none"
    ngram: int = 0  #: for lookup: length of the matched n-gram


class DraftModel(Protocol):
    """What the model drafter needs from a backend (see :class:`edgespec.runtime.backend.LlamaBackend`)."""

    n_ctx: int
    tokens: list[int]

    def sync(self, prefix: Sequence[int]) -> int: ...

    def decode(self, tokens: Sequence[int], n_logits: int) -> np.ndarray: ...

    # What more it can do, it declares (:mod:`edgespec.runtime.capabilities`): ``argmax``
    # (greedy drafts then never bring a row of logits to the host), ``device_window`` (the
    # device takes a sampled draft's window: no row reaches the host either), ``graph_shapes``
    # (a short catch-up then goes a token a call, on a replayed graph).


class Drafter(Protocol):
    name: str

    def propose(
        self, context: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator
    ) -> Draft:
        """Propose up to k tokens to follow ``context``."""
        ...


@dataclass(frozen=True)
class Outcome:
    """What one round did, reported back to drafters that learn (``auto``)."""

    draft: Draft | None
    drafted: int  #: tokens actually scored as drafts (the loop may cap the proposal)
    accepted: int
    new_tokens: list[int]  #: tokens committed this round
    t_draft: float
    t_target: float


class NoDrafter:
    """Plain decoding through the same loop: the baseline everything is compared with."""

    name = "none"

    def propose(self, context, k, params, rng) -> Draft:
        return Draft(source="none")


#: How far past the token where a copy broke off the text may come back to it (the copy's
#: next tokens replaced or dropped), and within how many tokens of the break (the inserted
#: tokens and the one the copy resumes at): LookupDrafter._resume. On a virtual H100
#: (``scripts/gpu/replay.py --drafters none,lookup``, 14 prompts) skips of 0, 1, 2 and 3 gave
#: lookup 0.98x, 1.00x, 1.00x and 1.00x of plain decoding on the bench's prompts (0.975x
#: without resuming); a window of 2 to 6 tokens 1.00x there and 1.19-1.21x on the held-out
#: ones (1.18x without); with no window, resumes far from the break cost 2-3% on each set.
RESUME_SKIP = 2
RESUME_WITHIN = 4


class LookupDrafter:
    """Copy the continuation of the longest recurring suffix n-gram (one-hot proposals).

    While the text goes on as the last proposal said, the copy is followed: the next proposal
    continues from where that one's source has got to, not from the most recent occurrence of
    the suffix. Text with recurring lines (a JSON list of similar records, repeated code) has
    the suffix many times over, and its most recent occurrence is often another line than the
    one being copied; on the bench's and the held-out prompts following the copy never
    proposed fewer right tokens than the most recent occurrence, and 22% more on a JSON edit.

    Where the text leaves a copy it had followed (an edit inserts or replaces a few tokens) and
    no n-gram of the new text recurs, the copy is taken up again as soon as the text comes back
    to it: once the last token is the one where the copy broke off (or one of the next
    ``RESUME_SKIP``), within ``RESUME_WITHIN`` tokens of the break. Adding type hints, the copy
    of ``def f(a, b)`` breaks after ``a`` for ``: int``, and the ``,`` after it resumes it with
    `` b)`` rather than waiting for two copied tokens to match again. Such a proposal rests on
    one token: its ``ngram`` is 1.
    """

    name = "lookup"

    def __init__(self, max_ngram: int = DEFAULT_MAX_NGRAM, min_ngram: int = DEFAULT_MIN_NGRAM):
        if not 1 <= min_ngram <= max_ngram:
            raise ConfigError(
                f"n-gram sizes must satisfy 1 <= min ({min_ngram}) <= max ({max_ngram})"
            )
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self._index = NgramIndex(max_ngram, min_ngram)
        #: the last proposal: (the text it was for, that text's length, where it started)
        self._last: tuple[list[int], int, int] | None = None
        self._followed = False  #: whether the last proposal went on with a copy (_follow)
        #: where the text last left a copy: (the text, the source position the copy had
        #: reached, the text position where it left)
        self._broke: tuple[list[int], int, int] | None = None

    def propose(self, context, k, params, rng) -> Draft:
        if isinstance(context, list):  # the loop's growing list: indexed incrementally
            match = self._follow(context, k)
            self._followed = match is not None
            if match is None:
                match = self._index.find(context, k) or self._resume(context, k)
            self._last = (context, len(context), match.start) if match else None
        else:
            match = find_continuation(
                context, max_ngram=self.max_ngram, min_ngram=self.min_ngram, max_tokens=k
            )
        if match is None or not match.tokens:
            return Draft(source="lookup")
        return Draft(match.tokens, [None] * len(match.tokens), "lookup", match.ngram)

    def _follow(self, context: list[int], k: int) -> LookupMatch | None:
        """The last proposal's copy, continued, if the tokens added since are what it said
        (and the copy's source still shares a suffix of at least ``min_ngram`` tokens with
        the text, its n-gram size); None otherwise."""
        last = self._last
        if last is None or last[0] is not context or k <= 0:
            return None
        then, start = last[1], last[2]
        n_tok = len(context)
        at = start + n_tok - then  # where the copy has got to, if the text followed it
        if not then <= n_tok or at >= n_tok:
            return None
        if context[then:] != context[start:at]:
            self._left(context, then, start, common_prefix(context[then:], context[start:at]))
            return None
        n = 0
        while n < min(self.max_ngram, at) and context[at - 1 - n] == context[n_tok - 1 - n]:
            n += 1
        if n < self.min_ngram:
            return None
        return LookupMatch(context[at:at + k], n, at)

    def _left(self, context: list[int], then: int, start: int, kept: int) -> None:
        """The text left the last proposal (made at length ``then``, copying from ``start``)
        after ``kept`` of its tokens. That is where a copy broke off if the text had followed
        it: some tokens of this proposal, or earlier ones (it went on with a copy). A fresh
        match refuted at once was never a copy of the text, and leaves the last break as is."""
        broke = self._broke
        if kept or self._followed or broke is None or broke[0] is not context:
            self._broke = (context, start + kept, then + kept)

    def _resume(self, context: list[int], k: int) -> LookupMatch | None:
        """The broken-off copy, taken up again where the text has come back to it (see the
        class's note), or None."""
        broke = self._broke
        if broke is None or broke[0] is not context or k <= 0:
            return None
        source, at = broke[1], broke[2]
        if len(context) - at > RESUME_WITHIN:
            return None
        last = context[-1]
        for s in range(source, min(source + RESUME_SKIP + 1, at)):
            if context[s] == last:
                return LookupMatch(context[s + 1:s + 1 + k], 1, s + 1)
        return None


#: Longest catch-up a draft model on a GPU feeds one token a call (ModelDrafter._catch_up): n
#: replayed single calls cost less than one call of width n and the two after it, up to ~4.
SINGLE_CATCHUP = 4


class ModelDrafter:
    """Sample k tokens autoregressively from a small GGUF model.

    The draft model's KV cache is kept in step with the committed text by ``sync``: accepted
    draft tokens stay cached, rejected ones are dropped, so each round decodes only what is new.
    Logits are mapped onto the target's vocabulary (``n_vocab``) before processing, so ``q`` and
    the target's ``p`` are distributions over the same tokens. Sampled drafts come from the
    row's ``window`` most likely tokens (:func:`edgespec.core.sampling.draft_distribution`;
    0: the whole row).
    """

    name = "model"

    def __init__(self, model: DraftModel, n_vocab: int, window: int = DRAFT_WINDOW, guide=None):
        self.model = model
        self.n_vocab = n_vocab
        self.window = window
        #: the generation's :class:`~edgespec.runtime.guide.Guide`, if its rows are shaped or
        #: constrained: the draft's rows then get the same bias, penalties and mask (a draft
        #: the constraint refuses would only be cut; one that ignores the penalties would be
        #: rejected more often)
        self.guide = guide if guide is not None and (guide.shaped or guide.constrained) else None
        self._cache = Follower(model)
        self._caps = capabilities(model)  #: (its device window is read anew: it may turn off)
        self._context: list[int] | None = None  #: the text the last proposal was for
        #: single-token calls in a row so far (in this text): from the third on, a GPU
        #: replays the draft context's graph, and their time is the steady per-token price
        self._singles = 0
        #: the last proposal's steady calls (step_cost): their seconds and number, and when
        #: the call before the next one ended
        self._steady_s = 0.0
        self._steady_n = 0
        self._last_end = 0.0

    def propose(self, context, k, params, rng) -> Draft:
        k = min(k, self.model.n_ctx - len(context))
        draft = Draft(source="model")
        if k <= 0:
            return draft
        n_cached = self._cache.sync(context, len(context))
        if n_cached == len(context):  # everything cached: re-feed the last token for its logits
            n_cached = self._cache.sync(context, len(context) - 1)
        if context is not self._context:  # (another text: the prefill was a wide call)
            self._context, self._singles = context, 0
        self._steady_n = 0
        self._steady_s = 0.0
        if self.guide is not None:
            draft = self._propose_guided(context[n_cached:], k, params, rng, draft)
        elif params.greedy and self._caps.argmax:
            draft = self._propose_greedy(context[n_cached:], k, draft)
        elif not params.greedy and self.window and capabilities(self.model).device_window:
            draft = self._propose_on_device(context[n_cached:], k, params, rng, draft)
        else:
            draft = self._propose_host(context[n_cached:], k, params, rng, draft)
        return draft

    def behind(self, context: list[int]) -> int:
        """Tokens of ``context`` the model would read before drafting after it: what its cache
        lacks or holds otherwise (drafts the text refused), at least the last token, which a
        proposal always feeds. O(what changed since the last proposal)."""
        held = self.model.tokens
        done = min(self._cache.verified(context), len(held))
        if not done:  # (not drafted for this text yet: its cache holds the prompt, if any)
            return max(len(context) - len(held), 1)
        agree = done + common_prefix(held[done:], context[done:len(held)])
        return max(len(context) - agree, 1)

    def wide(self, behind: int) -> bool:
        """Whether reading ``behind`` tokens takes one call for them all (else a call each:
        see :meth:`_catch_up`)."""
        return behind > 1 and not (self._caps.graph_shapes and behind <= SINGLE_CATCHUP)

    def step_cost(self) -> float | None:
        """Seconds per drafted token in the last proposal, as the calibration measures it
        (``measure_draft_cost``: single-token calls one after another), with the host's work
        on each: the mean of its calls after the first that were at least the third
        single-token call in a row, each from the end of the call before; None if none was.
        The first call is left out: it also reads what the text gained since the model last
        drafted (dozens of tokens after a stretch of lookup rounds), and on a GPU the two
        calls after a wide one run without a graph; counted in, one catch-up would price the
        model out of every round after it."""
        return self._steady_s / self._steady_n if self._steady_n else None

    def _stepped(self) -> None:
        """A drafting call after the first has returned: its time counts from the end of the
        call before it, so a drafted token's price holds the host's work on it too (a
        sampled draft's distribution: 0.1-0.5 ms a token beside an H100)."""
        now = time.perf_counter()
        self._singles += 1
        if self._singles >= 3:
            self._steady_s += now - self._last_end
            self._steady_n += 1
        self._last_end = now

    def _propose_host(self, feed: Sequence[int], k: int, params: SamplingParams,
                      rng: np.random.Generator, draft: Draft) -> Draft:
        """Drafts from whole logit rows on the host (sampled without a device window, or a
        model without arg-max picks)."""
        logits = self._catch_up(self.model.decode, feed)[0]
        for i in range(k):
            if logits.size > self.n_vocab:  # padding rows past the target's vocabulary
                logits = logits[: self.n_vocab]
            if params.greedy:  # q is one-hot on the arg-max (lowest id on ties, as in process)
                x, q = int(np.argmax(logits)), None
            else:  # (a copy: the row itself is overwritten by the next draft decode)
                q = draft_distribution(logits, params, self.n_vocab, self.window)
                x = q.sample(rng)
            draft.tokens.append(x)
            draft.q.append(q)
            if i + 1 < k:
                logits = self.model.decode([x], 1)[0]
                self._stepped()
        return draft

    def _propose_guided(self, feed: Sequence[int], k: int, params: SamplingParams,
                        rng: np.random.Generator, draft: Draft) -> Draft:
        """Drafts from whole rows on the host, each shaped by the guide for the position
        after the drafts before it; stops before an end-of-generation token."""
        guide = self.guide
        window = self.window

        def make(row, p, n):
            return draft_distribution(row, p, n, window)

        logits = self._catch_up(self.model.decode, feed)[0]
        for i in range(k):
            if logits.size > self.n_vocab:  # padding rows past the target's vocabulary
                logits = logits[: self.n_vocab]
            q = guide.distribution(make, logits, draft.tokens, self.n_vocab)
            x = q.sample(rng)  # (a one-hot consumes no randomness)
            if guide.is_eog(x):
                break
            draft.tokens.append(x)
            draft.q.append(None if params.greedy else q)
            if i + 1 < k:
                logits = self.model.decode([x], 1)[0]
                self._stepped()
        return draft

    def _propose_on_device(self, feed: Sequence[int], k: int, params: SamplingParams,
                           rng: np.random.Generator, draft: Draft) -> Draft:
        """Sampled drafts from windows the draft model's device took (its top-k in
        llama.cpp's graph): only ``window`` logits per row reach the host."""
        decode = self.model.decode_window
        ids, logits = self._catch_up(decode, feed, self.window)
        for i in range(k):
            if not (ids[0] < self.n_vocab).any():  # only padding ids past the target's: stop
                break
            q = window_distribution(ids[0], logits[0], params, self.n_vocab)
            x = q.sample(rng)
            draft.tokens.append(x)
            draft.q.append(q)
            if i + 1 < k:
                ids, logits = decode([x], 1, self.window)
                self._stepped()
        return draft

    def _propose_greedy(self, feed: Sequence[int], k: int, draft: Draft) -> Draft:
        """Greedy drafts from the draft model's own arg-max picks (one-hot: ``q`` is None)."""
        decode = self.model.decode_argmax
        x = int(self._catch_up(decode, feed)[0])
        for i in range(k):
            if x >= self.n_vocab:  # a padding id past the target's vocabulary: stop there
                break
            draft.tokens.append(x)
            draft.q.append(None)
            if i + 1 < k:
                x = int(decode([x], 1)[0])
                self._stepped()
        return draft

    def _catch_up(self, decode, feed: Sequence[int], *args):
        """``decode(feed, 1, *args)``: the tokens committed since the draft last decoded (the
        round's bonus or correction token, and the last draft when all were accepted), with
        the last one's output. On a GPU a short catch-up goes one token a call: a call of
        another width than the drafting calls' single token runs without a CUDA graph and
        makes the next two pay again (~1.4 ms each for the 0.5B draft on an H100, against
        ~1.15 ms a replayed call); on the H100 a drafted token cost 1.7-2.5 ms in rounds that
        mostly accepted everything (2-token catch-ups) and ~1.4 ms where they rarely did."""
        if len(feed) > 1 and not self.wide(len(feed)):
            for token in feed[:-1]:
                decode([token], 1, *args)
            self._singles += len(feed) - 1
            feed = feed[-1:]
        out = decode(feed, 1, *args)
        self._last_end = time.perf_counter()
        self._singles = 0 if len(feed) > 1 else self._singles + 1
        return out

    def wants_prompt_cached(self, k: int) -> bool:
        """Whether the draft model's cache should hold the prompt before the first round."""
        return True


class HybridDrafter:
    """Lookup when the text so far has a recurring n-gram; the draft model otherwise."""

    name = "hybrid"

    def __init__(self, lookup: LookupDrafter, model: ModelDrafter):
        self.lookup = lookup
        self.model = model

    def propose(self, context, k, params, rng) -> Draft:
        draft = self.lookup.propose(context, k, params, rng)
        if draft.tokens:
            return draft
        return self.model.propose(context, k, params, rng)

    def wants_prompt_cached(self, k: int) -> bool:
        return True


class AutoDrafter:
    """Each round, whichever of plain decoding, lookup and the draft model (and how many tokens)
    :class:`~edgespec.core.policy.Policy` rates best: a thin adapter between the policy, which
    decides and learns, and the drafters, which propose.

    The lookup proposal is made every round (it costs ~nothing) and compared with what the round
    committed: for a one-hot draft x, P(accept) = p(x) = P(committed token == x), so this shadow
    comparison estimates lookup's acceptance even in rounds that did not use it.
    """

    name = "auto"

    def __init__(self, policy, lookup: LookupDrafter, model: ModelDrafter | None = None) -> None:
        self.policy = policy
        self.lookup = lookup
        self.model = model
        self.choices: dict[int, int] = {}  #: k -> rounds (k = 0: plain decoding step)
        self._shadow: Draft | None = None
        policy.max_ngram = lookup.max_ngram  # (where the policy's chain of estimates ends)

    def propose(self, context, k, params, rng) -> Draft:
        t0 = time.perf_counter()
        shadow = self._shadow = self.lookup.propose(context, k, params, rng)
        self.policy.lookup_cost.observe(time.perf_counter() - t0)
        model = self.model is not None and self.policy.model_may_draft()
        behind = self.model.behind(context) if model else 1
        choice = self.policy.choose(Offer(k, len(shadow.tokens), shadow.ngram, model, behind,
                                          model and self.model.wide(behind)))
        self.choices[choice.k] = self.choices.get(choice.k, 0) + 1
        if choice.source == "lookup":
            return Draft(shadow.tokens[: choice.k], shadow.q[: choice.k], "lookup", shadow.ngram)
        if choice.source == "model":
            return self.model.propose(context, choice.k, params, rng)
        return Draft(source="none")

    def plain_next(self, k_max: int) -> bool:
        """Whether the round after this one (a plain step, proposed and not yet observed) will
        be plain too, whatever token the step commits (:meth:`Policy.plain_assured
        <edgespec.core.policy.Policy.plain_assured>`): then an asynchronous loop launches it
        before this drafter's work on it, which runs while the device computes."""
        shadow = self._shadow
        return self.policy.plain_assured(
            k_max, moved=shadow.ngram if shadow is not None and shadow.tokens else 0)

    def wants_prompt_cached(self, k: int) -> bool:
        """Only if the draft model could pay at all: otherwise its prefill is wasted time."""
        return self.model is not None and self.policy.model_can_pay(k)

    def observe(self, outcome: Outcome) -> None:
        """Hand the round to the policy, with lookup's shadow verdict and the draft's price."""
        shadow, lookup = self._shadow, None
        if shadow is not None and shadow.tokens:
            matched = common_prefix(shadow.tokens, outcome.new_tokens)
            # A mismatch is only seen if the round committed a token at that position.
            lookup = (shadow.ngram, matched,
                      matched < min(len(shadow.tokens), len(outcome.new_tokens)))
        draft = outcome.draft
        source = draft.source if draft is not None and outcome.drafted else "none"
        step = self.model.step_cost() if source == "model" and self.model is not None else None
        self.policy.observe(RoundOutcome(
            source, outcome.drafted + 1, outcome.drafted, outcome.accepted,
            len(outcome.new_tokens), outcome.t_target, outcome.t_draft, lookup, step))


def check_drafter_name(name: str) -> str:
    """Return ``name`` if it is a drafter, else raise ConfigError listing the valid ones."""
    if name not in DRAFTER_NAMES:
        raise ConfigError(f"unknown drafter {name!r}: choose one of {', '.join(DRAFTER_NAMES)}")
    return name


def make_drafter(
    name: str,
    draft_model: DraftModel | None = None,
    n_vocab: int = 0,
    *,
    max_ngram: int = DEFAULT_MAX_NGRAM,
    min_ngram: int = DEFAULT_MIN_NGRAM,
    policy=None,
    draft_window: int = DRAFT_WINDOW,
    guide=None,
) -> Drafter:
    """Build a drafter by name; ``model`` and ``hybrid`` need a loaded draft model, ``auto``
    a :class:`edgespec.core.policy.Policy` (it uses the draft model when there is one).
    ``draft_window``: the draft model's sampled proposals come from its this many most likely
    tokens (0: the whole row; see :class:`ModelDrafter`). ``guide``: the generation's shaping,
    which the draft model's rows get too."""
    if check_drafter_name(name) == "none":
        return NoDrafter()
    lookup = LookupDrafter(max_ngram, min_ngram)
    if name == "lookup":
        return lookup
    if name == "auto":
        if policy is None:
            raise ConfigError("drafter 'auto' needs a cost policy")
        model = (ModelDrafter(draft_model, n_vocab, draft_window, guide)
                 if draft_model is not None else None)
        return AutoDrafter(policy, lookup, model)
    if draft_model is None:
        raise ConfigError(f"drafter {name!r} needs a draft model (--draft)")
    model = ModelDrafter(draft_model, n_vocab, draft_window, guide)
    return model if name == "model" else HybridDrafter(lookup, model)
