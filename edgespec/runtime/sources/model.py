"""A draft model: a small GGUF model with the target's tokenizer, sampled autoregressively
with the target's processing, so that ``q`` and the target's ``p`` are distributions over the
same tokens. The registry offers it to ``auto`` as its ``paid`` source (a measured price per
drafted token)."""

from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np

from ...config import DRAFT_WINDOW
from ...core.dist import AnyDist
from ...core.lookup import common_prefix
from ...core.sampling import SamplingParams, draft_distribution, window_distribution
from ..cache import Follower
from ..capabilities import capabilities
from .base import Draft, Drafter, DraftModel, Kit, SourceSpec

#: Longest catch-up a draft model on a GPU feeds one token a call (ModelDrafter._catch_up): n
#: replayed single calls cost less than one call of width n and the two after it, up to ~4.
SINGLE_CATCHUP = 4

#: picks a draft token from one call's output: (token, its distribution or None for one-hot),
#: or None where drafting stops (a padding id past the target's vocabulary, an end of text)
Pick = Callable[[object, Sequence[int]], "tuple[int, AnyDist | None] | None"]


class ModelDrafter(Drafter):
    """Sample k tokens autoregressively from a small GGUF model.

    The draft model's KV cache is kept in step with the committed text by ``sync``: accepted
    draft tokens stay cached, rejected ones are dropped, so each round decodes only what is new.
    Logits are mapped onto the target's vocabulary (``n_vocab``) before processing. Sampled
    drafts come from the row's ``window`` most likely tokens
    (:func:`edgespec.core.sampling.draft_distribution`; 0: the whole row).

    One drafting loop (:meth:`_draft`): read what the text gained, then per token a pick from
    the call's output and a single-token call for the next. Where the output comes from is
    the mode: the device's arg-max picks (greedy), the device's top-``window`` (sampled, the
    output layer on a local GPU), whole rows on the host, or whole rows shaped by the
    generation's guide (bias, penalties, a constraint's mask) on the host.
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
        if k <= 0:
            return Draft(source="model")
        n_cached = self._cache.sync(context, len(context))
        if n_cached == len(context):  # everything cached: re-feed the last token for its logits
            n_cached = self._cache.sync(context, len(context) - 1)
        if context is not self._context:  # (another text: the prefill was a wide call)
            self._context, self._singles = context, 0
        self._steady_n = 0
        self._steady_s = 0.0
        decode, pick, extra = self._mode(params, rng)
        return self._draft(context[n_cached:], k, decode, pick, extra)

    def _mode(self, params: SamplingParams, rng: np.random.Generator):
        """(the decode call, the pick from its output, the call's extra arguments) for this
        generation's settings."""
        n_vocab = self.n_vocab
        guide = self.guide
        if guide is not None:
            window = self.window

            def make(row, p, n):
                return draft_distribution(row, p, n, window)

            def guided(out, ahead):
                q = guide.distribution(make, out[0][:n_vocab], ahead, n_vocab)
                x = q.sample(rng)  # (a one-hot consumes no randomness)
                return None if guide.is_eog(x) else (x, None if params.greedy else q)

            return self.model.decode, guided, ()
        if params.greedy and self._caps.argmax:
            def picked(out, ahead):  # one-hot on the device's arg-max
                x = int(out[0])
                return None if x >= n_vocab else (x, None)

            return self.model.decode_argmax, picked, ()
        if not params.greedy and self.window and capabilities(self.model).device_window:
            def windowed(out, ahead):  # the device's top-window ids and logits
                ids, logits = out[0][0], out[1][0]
                if not (ids < n_vocab).any():  # only padding ids past the target's: stop
                    return None
                q = window_distribution(ids, logits, params, n_vocab)
                return q.sample(rng), q

            return self.model.decode_window, windowed, (self.window,)

        def host(out, ahead):  # a whole row (padding past the target's vocabulary cut)
            row = out[0][:n_vocab]
            if params.greedy:  # q is one-hot on the arg-max (lowest id on ties, as in process)
                return int(np.argmax(row)), None
            q = draft_distribution(row, params, n_vocab, self.window)  # (a copy of the row)
            return q.sample(rng), q

        return self.model.decode, host, ()

    def _draft(self, feed: Sequence[int], k: int, decode, pick: Pick, extra: tuple) -> Draft:
        """Catch up on ``feed``, then up to ``k`` picks, a single-token call between two."""
        draft = Draft(source="model")
        out = self._catch_up(decode, feed, *extra)
        for i in range(k):
            picked = pick(out, draft.tokens)
            if picked is None:
                break
            draft.tokens.append(picked[0])
            draft.q.append(picked[1])
            if i + 1 < k:
                out = decode([picked[0]], 1, *extra)
                self._stepped()
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
        see :meth:`_catch_up`). A draft model with recurrent layers always reads them in one:
        its prefill call leaves the checkpoint its next rollback goes back to
        (:mod:`edgespec.runtime.recurrent`)."""
        return behind > 1 and (getattr(self.model, "recurrent", False)
                               or not (self._caps.graph_shapes and behind <= SINGLE_CATCHUP))

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
        return True


SPEC = SourceSpec(
    "model",
    lambda kit: ModelDrafter(kit.draft_model, kit.n_vocab, kit.draft_window, kit.guide),
    "the draft model, sampled as the target is", draft_model="required", auto_role="paid")
