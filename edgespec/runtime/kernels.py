"""The three ways a target's logits relate to batch shape, named for reports.

Speculation is exact only if the target scores a token the same whether it is alone in a call
(plain decoding) or inside a verification batch. :class:`edgespec.runtime.backend.LlamaBackend`
runs in one of these modes (its ``kernels`` attribute); ``verify``, ``info`` and ``bench`` say
which, in these words.
"""

from __future__ import annotations

#: ggml-cpu kernels with logit-reading calls in pieces that take the single-token kernels
EXACT_PIECES = "exact-pieces"
#: every logit-reading call padded to one width: one kernel shape on any device
EXACT_FIXED_WIDTH = "exact-fixed-width"
#: each batch in one call: its logits move with the batch width (GPU, --fast-kernels)
BATCH_DEPENDENT = "batch-dependent"


def mode_of(model: object) -> str:
    """A backend's kernel mode (a test fake without one counts as its options say)."""
    mode = getattr(model, "kernels", None)
    if mode is not None:
        return mode
    options = getattr(model, "options", None)
    return EXACT_PIECES if getattr(options, "batch_consistent", True) else BATCH_DEPENDENT


def describe(model: object) -> str:
    """The mode in words, e.g. ``exact (fixed width 8: every logit-reading call 8 tokens wide)``."""
    mode = mode_of(model)
    if mode == EXACT_FIXED_WIDTH:
        width = getattr(model, "fixed_width", 0)
        return f"exact (fixed width {width}: every logit-reading call {width} tokens wide)"
    if mode == EXACT_PIECES:
        return "exact (batch-consistent CPU kernels)"
    return "batch-dependent (logits move with the batch width)"
