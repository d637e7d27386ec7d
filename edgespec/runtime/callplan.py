"""The call plan: how one decode's tokens are split into ``llama_decode`` calls.

A decode appends ``n_tokens`` tokens to a context's cache and reads the logits of the last
``n_logits`` of them (the *rows* of its result, in token order). The tokens before those (a
prompt's prefill) go in calls of the batch size, none of their rows an output. The tokens whose
rows are read go in calls of one *step*: at a fixed width, that width, and each call is padded to
exactly it with throw-away copies of its last token, every row an output, so that every call has
one kernel shape; otherwise the CPU's batch-consistent *piece* (every row then goes through a
single token's matmul kernels), else at most ``most_rows`` (the rows llama.cpp's backend sampler
picks from in one call), and never more than the batch size. Rows the caller will not read
(``unread``) are no outputs, and llama.cpp skips their output projection; the calls are split as
if they were read, so the rows that are read, and the cache, are the same bits. A plan is a list
of :class:`Call` records, computed here from numbers alone (no llama.cpp, no buffers);
:class:`edgespec.runtime.llama_context.LlamaContext` fills a batch from each and runs it.
"""

from __future__ import annotations

from typing import Collection, NamedTuple


class Call(NamedTuple):
    """One ``llama_decode`` call: the decode's ``tokens[start:stop]``, at the cache positions
    after what the cache held before the decode, then ``pads`` copies of the last of them."""

    start: int
    stop: int
    #: the call's first token whose row is read (``stop - start``: it reads none); the rows
    #: before it are no outputs
    read_from: int
    #: the result row of that token (0 for a call that reads none)
    first_row: int = 0
    #: of the rows from ``read_from`` on, those that are no outputs (indices within the call)
    unread: tuple[int, ...] = ()
    #: throw-away copies of the last token at the next positions, up to the fixed width; a
    #: padded call reads every token's row, and every row, pads too, is an output
    pads: int = 0

    @property
    def size(self) -> int:
        """Tokens of the decode this call feeds."""
        return self.stop - self.start

    @property
    def width(self) -> int:
        """The call's batch: its tokens and its pads."""
        return self.stop - self.start + self.pads

    @property
    def reads(self) -> bool:
        """Whether any of the decode's rows come from this call."""
        return self.read_from < self.stop - self.start

    @property
    def n_read(self) -> int:
        """The decode's rows this call gives (unread ones included)."""
        return self.stop - self.start - self.read_from

    @property
    def n_outputs(self) -> int:
        """Rows llama.cpp computes logits for: every row of a padded call, else the rows read
        but the unread ones."""
        return self.width if self.pads else self.n_read - len(self.unread)

    @property
    def first_output(self) -> int:
        """The output index of the row of token ``read_from`` (a padded call's earlier rows are
        outputs too)."""
        return self.read_from if self.pads else 0

    def output_rows(self) -> list[int]:
        """The result rows of this call's outputs, in output order (an unpadded call's)."""
        skipped = set(self.unread)
        return [self.first_row + j - self.read_from
                for j in range(self.read_from, self.stop - self.start) if j not in skipped]


def read_step(batch: int, *, width: int = 0, piece: int = 0, most_rows: int | None = None) -> int:
    """Tokens per call where rows are read: the fixed width, else the piece, else ``most_rows``,
    at most ``batch`` (a fixed width is never more: the context checks it)."""
    if width:
        return width
    if piece:
        return min(piece, batch)
    if most_rows is not None:
        return min(most_rows, batch)
    return batch


def _spans(begin: int, end: int, step: int) -> list[tuple[int, int]]:
    """``[begin, end)`` cut into runs of ``step``, the last one shorter."""
    return [(start, min(start + step, end)) for start in range(begin, end, step)]


def plan(n_tokens: int, n_logits: int, *, batch: int, width: int = 0, piece: int = 0,
         most_rows: int | None = None, unread: Collection[int] = ()) -> list[Call]:
    """The calls that decode ``n_tokens`` tokens and read the rows of the last ``n_logits``:
    the prefill in calls of ``batch`` tokens, then the read tokens in calls of
    :func:`read_step`, padded to ``width`` where it is set. ``unread``: result rows that are no
    outputs (ignored by a padded call, whose every row is one: pass none at a fixed width)."""
    if not 0 <= n_logits <= n_tokens:
        raise ValueError(f"n_logits={n_logits} for {n_tokens} tokens")
    first_read = n_tokens - n_logits
    calls = [Call(start, stop, stop - start) for start, stop in _spans(0, first_read, batch)]
    step = read_step(batch, width=width, piece=piece, most_rows=most_rows)
    skipped = frozenset(unread)
    for start, stop in _spans(first_read, n_tokens, step):
        first_row = start - first_read
        off = tuple(j for j in range(stop - start) if first_row + j in skipped) if skipped else ()
        pads = width - (stop - start) if width else 0
        calls.append(Call(start, stop, 0, first_row, off, pads))
    return calls


def one_call(n_tokens: int, n_logits: int, *, width: int = 0) -> Call:
    """All ``n_tokens`` in one call, the rows of the last ``n_logits`` read (a call launched
    to run while the caller works); at a fixed width padded to it, which reads every row."""
    if not 0 < n_logits <= n_tokens or width and (n_logits < n_tokens or n_tokens > width):
        raise ValueError(f"one call cannot read {n_logits} of {n_tokens} tokens at width {width}")
    return Call(0, n_tokens, n_tokens - n_logits, 0, (), width - n_tokens if width else 0)
