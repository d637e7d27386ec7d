"""What one generation does to each row before it is processed: logit bias and penalties
(:mod:`edgespec.core.penalties`) and a constraint's mask (:mod:`edgespec.runtime.constraint`),
for the target's rows and the draft model's alike, and the log-probabilities it reports.

A scored row follows the committed text plus the drafts before it in the round, so its
shaping depends on them: :meth:`Guide.row` takes those drafts (``ahead``) and brings the
constraint's state there first (a rollback to what it shares with the last position asked,
then the rest consumed), so rows asked in order cost one step each. :meth:`Guide.commit`
moves the base to the round's committed tokens. The matcher's state is thus always the
committed text plus some drafted tokens, all of which it allowed.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..core.dist import AnyDist, OneHot
from ..core.penalties import shape
from ..core.sampling import SamplingParams


class Guide:
    """Shaping for one generation. ``matcher``: a :class:`~edgespec.runtime.constraint.Matcher`
    (or a test's stand-in) or None; ``committed``: the loop's list of committed tokens (read,
    never changed here); ``logprobs``: None, or how many alternatives each emitted token's
    log-probability comes with."""

    def __init__(self, params: SamplingParams, matcher=None, committed: list[int] | None = None,
                 logprobs: int | None = None, is_eog=None) -> None:
        self.params = params
        #: end-of-generation tokens end the text: never consumed by the matcher (a complete
        #: grammar refuses them; the generation stops at one anyway), never drafted
        self.is_eog = is_eog or (lambda token: False)
        self.matcher = matcher
        self.committed = committed if committed is not None else []
        self.logprobs = logprobs
        self.shaped = params.shaped
        self._ahead: list[int] = []  #: tokens past the committed text the matcher has consumed

    @property
    def constrained(self) -> bool:
        return self.matcher is not None

    # ---- the matcher's position ------------------------------------------------------------

    def seek(self, ahead: Sequence[int]) -> None:
        """Bring the matcher to the committed text followed by ``ahead``."""
        if self.matcher is None:
            return
        for i, token in enumerate(ahead):
            if self.is_eog(token):  # (the text ends there: nothing after it is asked)
                ahead = ahead[:i]
                break
        have = self._ahead
        same = 0
        n = min(len(have), len(ahead))
        while same < n and have[same] == ahead[same]:
            same += 1
        if same < len(have):
            self.matcher.pop(len(have) - same)
            del have[same:]
        if same < len(ahead):
            rest = list(ahead[same:])
            self.matcher.push(rest)
            have.extend(rest)

    def commit(self, new: Sequence[int]) -> None:
        """The round committed ``new`` (the caller appends them to ``committed``)."""
        self.seek(new)
        self._ahead = []

    # ---- proposals -------------------------------------------------------------------------

    def forced(self) -> list[int]:
        """Tokens the constraint forces after the committed text (none without one)."""
        if self.matcher is None:
            return []
        self.seek(())
        return self.matcher.forced()

    def valid(self, tokens: Sequence[int]) -> int:
        """How many of a proposal's tokens, from the first, may be drafted: those before the
        first end-of-generation token that the constraint allows."""
        n = 0
        while n < len(tokens) and not self.is_eog(tokens[n]):
            n += 1
        if self.matcher is None or not n:
            return n
        self.seek(())
        return self.matcher.valid(tokens[:n])

    # ---- rows ------------------------------------------------------------------------------

    def only(self, ahead: Sequence[int]) -> int | None:
        """The one token the constraint allows after ``ahead``, if only one is."""
        if self.matcher is None:
            return None
        self.seek(ahead)
        return self.matcher.only()

    def settled(self, tokens: Sequence[int]) -> list[int]:
        """The rows of a round scoring ``tokens`` (row i: the position after the first i)
        whose position the constraint leaves one token: their logits are never read."""
        if self.matcher is None:
            return []
        return [i for i in range(len(tokens) + 1) if self.only(tokens[:i]) is not None]

    def row(self, logits: np.ndarray, ahead: Sequence[int]) -> np.ndarray:
        """``logits`` shaped for the position after the committed text and ``ahead``: bias
        and penalties, then the constraint's mask (a new array; ``logits`` may be llama.cpp's
        read-only buffer)."""
        x = logits
        if self.shaped:
            n = self.params.penalty_last_n  # (shape() takes the window's last n itself)
            committed = self.committed
            recent = committed if n < 0 else committed[max(len(committed) - n, 0):]
            x = shape(x, self.params, [*recent, *ahead])
        if self.matcher is not None:
            self.seek(ahead)
            x = self.matcher.apply(x)
        return x

    def distribution(self, make, logits: np.ndarray, ahead: Sequence[int],
                     n_vocab: int | None = None) -> AnyDist:
        """``make(row, params[, n_vocab])`` of the shaped row, or the one-hot of the only
        token the constraint allows there (no logits needed)."""
        only = self.only(ahead)
        if only is not None:
            return OneHot(only, n_vocab or logits.size)
        row = self.row(logits, ahead)
        return make(row, self.params) if n_vocab is None else make(row, self.params, n_vocab)


def log_probs(logits: np.ndarray, token: int, top: int) -> tuple[float, tuple[tuple[int, float], ...]]:
    """The log-softmax of a raw row of logits at ``token``, and its ``top`` most likely tokens
    with theirs (as OpenAI and llama-server report them: the model's own distribution, before
    sampling settings, penalties or constraints)."""
    x = np.asarray(logits, dtype=np.float32)
    m = float(x.max())
    lse = m + math.log(float(np.exp(x - np.float32(m), dtype=np.float32).sum(dtype=np.float64)))
    own = float(x[token]) - lse
    if top <= 0:
        return own, ()
    ids = np.argpartition(x, x.size - top)[x.size - top:]
    ids = ids[np.lexsort((ids, -x[ids]))]
    return own, tuple((int(i), float(x[i]) - lse) for i in ids)
