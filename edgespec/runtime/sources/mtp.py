"""Drafts from the target's own multi-token-prediction layers (an MTP head: Qwen3.5's
"nextn" block), as llama.cpp's ``draft-mtp`` does (:mod:`edgespec.runtime.mtp` has the
protocol and the head).

The head reads, for each position, the token there and the target's hidden state one position
earlier. The target computes those states in its own decode calls; :class:`HiddenRows`, hooked
to the target's context (``on_call``), keeps each call's rows by position, and the head reads
the ones of committed tokens before it drafts: what the text gained since the last proposal,
whatever source played the rounds in between (only committed tokens: a rejected draft's row is
overwritten when the target decodes that position again). A position whose row is not kept (a
prompt cached while no head was listening) is read with a zero row: a weaker draft there, never
a wrong text. Drafts are sampled from the head's rows processed as the target's are (exact
rejection needs only that ``q`` is what they were drawn from); greedy takes each row's arg-max.
Its price per token is measured like a draft model's, and ``auto`` plays it as its ``paid``
source where the target has such layers (registered before ``model``).
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from ...config import DRAFT_WINDOW
from ...core.lookup import common_prefix
from ...core.sampling import SamplingParams, draft_distribution
from .base import Draft, Drafter, Kit, SourceSpec


class HiddenRows:
    """The target's hidden row at each position it decoded, with the token it read there: at
    most the newest ``keep`` positions (while no ``mtp`` round reads them, e.g. a long stretch
    of plain decoding, the older ones go; the head reads them as zero rows)."""

    def __init__(self, head, keep: int = 4096) -> None:
        self.head = head
        self.keep = keep
        self.rows: dict[int, tuple[int, np.ndarray]] = {}

    def __call__(self, pos: int, tokens: np.ndarray) -> None:
        """A target call of ``tokens`` at ``pos..`` is done: keep its rows."""
        rows = self.head.target_rows(len(tokens))
        for i, token in enumerate(tokens.tolist()):
            self.rows[pos + i] = (token, rows[i])
        if len(self.rows) > self.keep + self.keep // 4:  # (now and then: amortised)
            self.forget_before(pos + len(tokens) - self.keep)

    def take(self, tokens: Sequence[int], start: int) -> np.ndarray:
        """The rows of ``tokens`` at ``start..`` (zero where not kept), forgetting them."""
        out = np.zeros((len(tokens), self.head.n_embd), np.float32)
        for i, token in enumerate(tokens):
            kept = self.rows.pop(start + i, None)
            if kept is not None and kept[0] == token:
                out[i] = kept[1]
        return out

    def forget_before(self, pos: int) -> None:
        """Drop the rows before ``pos`` (read, or of a text gone)."""
        for p in [p for p in self.rows if p < pos]:
            del self.rows[p]


class MtpDrafter(Drafter):
    """Up to k tokens from the target's MTP head, fed the committed text's hidden rows."""

    name = "mtp"

    def __init__(self, head, rows: HiddenRows, n_vocab: int, window: int = DRAFT_WINDOW,
                 guide=None) -> None:
        self.head = head
        self.rows = rows
        self.n_vocab = n_vocab
        self.window = window
        self.guide = guide if guide is not None and (guide.shaped or guide.constrained) else None
        self._step_s: float | None = None
        self._context: Sequence[int] | None = None  #: the text the last proposal was for

    def propose(self, context, k, params: SamplingParams, rng: np.random.Generator) -> Draft:
        head = self.head
        n = len(context) - 1  # the newest token is fed by the draft itself
        k = min(k, head.n_ctx - n)
        if k <= 0 or n < 0:
            return Draft(source=self.name)
        # The head holds only committed tokens of the text it last drafted for, which only
        # grows: for that text all it holds stands (a compare of the whole text once a text).
        if context is self._context and head.n_past <= n:
            keep = head.n_past
        else:
            keep = common_prefix(head.tokens, context[:n]) if head.n_past else 0
            self._context = context
        head.rollback(keep)
        if keep < n:
            feed = context[keep:n]
            head.catch_up(feed, self.rows.take(feed, keep))
        self.rows.forget_before(n)
        t0 = time.perf_counter()
        drafted = head.draft(context[-1], k, self._pick(params, rng))
        if drafted.tokens:
            self._step_s = (time.perf_counter() - t0) / len(drafted.tokens)
        return Draft(list(drafted.tokens), list(drafted.q), source=self.name)

    def _pick(self, params: SamplingParams, rng: np.random.Generator):
        """The pick from each of the head's rows: the arg-max (greedy, q one-hot), else a sample
        from the row processed as the target's (shaped by the generation's guide, if any)."""
        n_vocab, guide, window = self.n_vocab, self.guide, self.window
        ahead: list[int] = []
        if guide is not None:
            def make(row, p, n):
                return draft_distribution(row, p, n, window)

            def guided(row):
                q = guide.distribution(make, row[:n_vocab], ahead, n_vocab)
                x = q.sample(rng)
                if guide.is_eog(x):
                    return None
                ahead.append(x)
                return x, None if params.greedy else q

            return guided
        if params.greedy:
            return lambda row: (int(np.argmax(row[:n_vocab])), None)

        def sampled(row):
            q = draft_distribution(row[:n_vocab], params, n_vocab, window)
            return q.sample(rng), q

        return sampled

    def behind(self, context) -> int:
        """Tokens the head reads before drafting after ``context`` (``auto`` prices the
        catch-up): what the text gained since it last drafted, at least the newest token."""
        return max(len(context) - self.head.n_past, 1)

    def wide(self, behind: int) -> bool:
        """Whether reading ``behind`` tokens is one call for them all before the steps."""
        return behind > 1

    def step_cost(self) -> float | None:
        """Seconds per drafted token in the last proposal (the head's steps and the host's
        pick), for ``auto``'s price of its paid source."""
        return self._step_s


def measure_step(head, n: int = 3, repeats: int = 3) -> float:
    """Seconds per drafted token: ``n`` greedy head steps after a short text, the median of
    ``repeats`` runs (the head's cache left as it was)."""
    samples = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        head.draft(0, n)
        samples.append((time.perf_counter() - t0) / n)
    return float(np.median(samples))


def _make(kit: Kit) -> MtpDrafter:
    head, rows = kit.mtp
    return MtpDrafter(head, rows, kit.n_vocab, kit.draft_window, kit.guide)


SPEC = SourceSpec(
    "mtp", _make, "the target's own multi-token-prediction layers (Qwen3.5's MTP head)",
    extra_context=True, hidden_state=True, auto_role="paid")
