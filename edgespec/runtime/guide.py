"""What one generation does to each row before it is processed, in three parts with one job
each, for the target's rows and the draft model's alike:

- :class:`Shaping`: logit bias and penalties (:mod:`edgespec.core.penalties`) over the text a
  row follows;
- :class:`Cursor`: a constraint's matcher (:mod:`edgespec.runtime.constraint`) kept at the
  position a row follows, its mask, and what it forces or refuses;
- ``logprobs``: how many alternatives each emitted token's log-probability (:func:`log_probs`)
  comes with, read where a round is committed.

A scored row follows the committed text plus the drafts before it in the round, so its shaping
depends on them: rows take those drafts (``ahead``). The cursor brings the matcher there by a
rollback to what it shares with the last position asked, then the rest consumed, so rows asked
in order cost one step each; :meth:`Cursor.commit` moves its base to the round's committed
tokens. The matcher's state is thus always the committed text plus some drafted tokens, all of
which it allowed. :class:`Guide` joins the parts where a row is made.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from ..core.dist import AnyDist, OneHot
from ..core.penalties import shape
from ..core.sampling import SamplingParams


class Shaping:
    """Logit bias and penalties as llama.cpp applies them, over the last ``penalty_last_n``
    tokens of the text a row follows (``committed``: the loop's list, read, never changed)."""

    def __init__(self, params: SamplingParams, committed: list[int]) -> None:
        self.params = params
        self.committed = committed

    def row(self, logits: np.ndarray, ahead: Sequence[int]) -> np.ndarray:
        """``logits`` shaped for the position after the committed text and ``ahead``."""
        n = self.params.penalty_last_n  # (shape() takes the window's last n itself)
        committed = self.committed
        recent = committed if n < 0 else committed[max(len(committed) - n, 0):]
        return shape(logits, self.params, [*recent, *ahead])


class Cursor:
    """A constraint's matcher at the committed text plus ``ahead`` drafted tokens.
    End-of-generation tokens end the text: never consumed (a complete grammar refuses them;
    the generation stops at one anyway), never drafted."""

    def __init__(self, matcher, is_eog: Callable[[int], bool]) -> None:
        self.matcher = matcher
        self.is_eog = is_eog
        self._ahead: list[int] = []  #: tokens past the committed text the matcher has consumed

    def seek(self, ahead: Sequence[int]) -> None:
        """Bring the matcher to the committed text followed by ``ahead``."""
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
        """The round committed ``new``: they become the base."""
        self.seek(new)
        self._ahead = []

    def forced(self) -> list[int]:
        """Tokens the constraint forces after the committed text."""
        self.seek(())
        return self.matcher.forced()

    def valid(self, tokens: Sequence[int]) -> int:
        """How many of a proposal's tokens, from the first, the constraint allows."""
        self.seek(())
        return self.matcher.valid(tokens)

    def only(self, ahead: Sequence[int]) -> int | None:
        """The one token the constraint allows after ``ahead``, if only one is."""
        self.seek(ahead)
        return self.matcher.only()

    def settled(self, tokens: Sequence[int]) -> list[int]:
        """The rows of a round scoring ``tokens`` (row i: the position after the first i)
        whose position the constraint leaves one token: their logits are never read."""
        return [i for i in range(len(tokens) + 1) if self.only(tokens[:i]) is not None]

    def mask(self, logits: np.ndarray, ahead: Sequence[int]) -> np.ndarray:
        """``logits`` with what the constraint refuses after ``ahead`` masked (a new array)."""
        self.seek(ahead)
        return self.matcher.apply(logits)


class Guide:
    """Shaping for one generation. ``matcher``: a :class:`~edgespec.runtime.constraint.Matcher`
    (or a test's stand-in) or None; ``logprobs``: None, or how many alternatives each emitted
    token's log-probability comes with. :meth:`begin` names the text the rows follow (the
    loop's list of committed tokens)."""

    def __init__(self, params: SamplingParams, matcher=None, committed: list[int] | None = None,
                 logprobs: int | None = None, is_eog=None) -> None:
        self.params = params
        self.is_eog = is_eog or (lambda token: False)
        self.logprobs = logprobs
        self.shaped = params.shaped
        self.cursor = Cursor(matcher, self.is_eog) if matcher is not None else None
        self.shaping: Shaping | None = None
        self.begin(committed if committed is not None else [])

    def begin(self, committed: list[int]) -> None:
        """Rows follow ``committed`` (read, never changed here) from now on."""
        self.shaping = Shaping(self.params, committed) if self.shaped else None

    @property
    def constrained(self) -> bool:
        return self.cursor is not None

    # ---- proposals: what the constraint forces and allows ----------------------------------

    def forced(self) -> list[int]:
        """Tokens the constraint forces after the committed text (none without one)."""
        return self.cursor.forced() if self.cursor is not None else []

    def valid(self, tokens: Sequence[int]) -> int:
        """How many of a proposal's tokens, from the first, may be drafted: those before the
        first end-of-generation token that the constraint allows."""
        n = 0
        while n < len(tokens) and not self.is_eog(tokens[n]):
            n += 1
        if self.cursor is None or not n:
            return n
        return self.cursor.valid(tokens[:n])

    def commit(self, new: Sequence[int]) -> None:
        """The round committed ``new`` (the caller appends them to the committed text)."""
        if self.cursor is not None:
            self.cursor.commit(new)

    # ---- rows ------------------------------------------------------------------------------

    def only(self, ahead: Sequence[int]) -> int | None:
        """The one token the constraint allows after ``ahead``, if only one is."""
        return self.cursor.only(ahead) if self.cursor is not None else None

    def settled(self, tokens: Sequence[int]) -> list[int]:
        """Rows of a round scoring ``tokens`` whose logits are never read (:meth:`Cursor.settled`)."""
        return self.cursor.settled(tokens) if self.cursor is not None else []

    def row(self, logits: np.ndarray, ahead: Sequence[int]) -> np.ndarray:
        """``logits`` shaped for the position after the committed text and ``ahead``: bias
        and penalties, then the constraint's mask (a new array; ``logits`` may be llama.cpp's
        read-only buffer)."""
        x = logits
        if self.shaping is not None:
            x = self.shaping.row(x, ahead)
        if self.cursor is not None:
            x = self.cursor.mask(x, ahead)
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
