"""Taking a recurrent cache back: snapshots inside the last call, checkpoints beyond it.

A hybrid model's recurrent layers (Gated DeltaNet, Mamba, short convolutions: Qwen3.5, LFM2,
Granite 4, Nemotron-H) keep one state per sequence, not one cache entry per position, so
dropping the cache's last r tokens means going back to an earlier state. llama.cpp keeps that
state for positions of the *last decode call* only (``n_rs_seq`` snapshots): after a call of w
tokens, ``llama_memory_seq_rm`` may drop r <= min(w - 1, n_rs_seq) of them, once, and the state
is then bit-identical to never having gone past; for a longer cut, or after a one-token call,
it still answers true and the state is silently wrong. So the reach is kept here from the calls
made, never read from ``seq_rm``'s answer.

Beyond the reach the context restores a *checkpoint*: a copy of the recurrent part of the
sequence's state (``llama_state_seq_get_data_ext`` with ``PARTIAL_ONLY``, as llama.cpp's server
does), taken after each prefill call, i.e. at known lengths; attention's cells past that length
are then dropped and the caller reads the tokens after it again. A later prompt that diverges
inside the cache thus reads from the last checkpoint before the divergence, not from the start,
and a draft model, whose drafts are one-token calls that leave no reach, goes back to the
checkpoint its catch-up call left. A target never needs one inside a round: the loop drafts no
more than the reach of one call (:attr:`edgespec.runtime.llama_context.LlamaContext.draft_reach`),
and a rejected draft costs a ``seq_rm``, not a re-read.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from ..config import RECURRENT_CHECKPOINTS
from ..errors import ModelError

import llama_cpp  # noqa: E402

_PARTIAL = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY


@dataclass(frozen=True)
class Checkpoint:
    """The recurrent state after the cache's first ``n`` tokens."""

    n: int
    data: ctypes.Array


class RecurrentMemory:
    """The reach and the checkpoints of sequence 0 of one context with recurrent layers."""

    def __init__(self, ctx, snapshots: int, keep: int = RECURRENT_CHECKPOINTS) -> None:
        self._ctx = ctx  #: the ``llama_context`` pointer
        #: recurrent-state snapshots llama.cpp keeps per sequence (0: it cannot roll back)
        self.snapshots = snapshots
        self.keep = keep
        #: the cached tokens a ``seq_rm`` may drop now: inside the last call, once
        self.reach = 0
        self.checkpoints: list[Checkpoint] = []
        #: checkpoints restored and full re-reads so far (for reports and tests)
        self.restores = 0
        self.rereads = 0

    def called(self, width: int) -> None:
        """A decode call of ``width`` tokens ran: its snapshots replace the last ones."""
        self.reach = min(width - 1, self.snapshots)

    def cut(self, memory, held: int, n: int) -> int:
        """Drop the cache's tokens after the first ``n`` of ``held``; return how many stay
        (``n``, or a checkpoint's length, or 0 where none is left: the caller reads the rest
        again)."""
        drop = held - n
        self.forget(n)
        if 0 < drop <= self.reach:
            self.reach = 0
            if not llama_cpp.llama_memory_seq_rm(memory, 0, n, -1):
                raise ModelError(f"llama.cpp refused to roll back {drop} tokens")
            return n
        self.reach = 0
        if self.checkpoints and self._restore(self.checkpoints[-1]):
            kept = self.checkpoints[-1].n
            if llama_cpp.llama_memory_seq_rm(memory, 0, kept, -1):
                self.restores += 1
                return kept
        llama_cpp.llama_memory_clear(memory, True)
        self.checkpoints.clear()
        self.rereads += n > 0
        return 0

    def save(self, n: int) -> None:
        """Keep a checkpoint of the state after the first ``n`` cached tokens (the newest
        :attr:`keep`)."""
        size = llama_cpp.llama_state_seq_get_size_ext(self._ctx, 0, _PARTIAL)
        data = (ctypes.c_uint8 * size)()
        if llama_cpp.llama_state_seq_get_data_ext(self._ctx, data, size, 0, _PARTIAL) != size:
            return
        self.forget(n - 1)
        self.checkpoints.append(Checkpoint(n, data))
        del self.checkpoints[:-self.keep]

    def forget(self, n: int) -> None:
        """Drop the checkpoints past the first ``n`` tokens (the cache no longer holds them)."""
        while self.checkpoints and self.checkpoints[-1].n > n:
            self.checkpoints.pop()

    def clear(self) -> None:
        """The cache was emptied."""
        self.reach = 0
        self.checkpoints.clear()

    def _restore(self, point: Checkpoint) -> bool:
        data = point.data
        return llama_cpp.llama_state_seq_set_data_ext(self._ctx, data, len(data), 0,
                                                       _PARTIAL) == len(data)
