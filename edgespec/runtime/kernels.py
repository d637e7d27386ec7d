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


def flash_attention_off(options: object) -> bool:
    """Whether a model loaded with these ``ModelOptions`` runs without flash attention: in the
    batch-consistent mode without a fixed width (a single query takes flash attention's
    split-KV path once the cache reaches 512 cells). At a fixed width no call has one query row,
    and flash attention's kernels then give the same rows for every k; with fast kernels
    nothing needs to match: either way it stays at llama.cpp's default, on where it runs."""
    return bool(getattr(options, "batch_consistent", True)) and not getattr(options, "fixed_width", 0)


def describe(model: object) -> str:
    """The mode in words, e.g. ``exact (fixed width 8: every logit-reading call 8 tokens wide)``."""
    mode = mode_of(model)
    if mode == EXACT_FIXED_WIDTH:
        width = getattr(model, "fixed_width", 0)
        return f"exact (fixed width {width}: every logit-reading call {width} tokens wide)"
    if mode == EXACT_PIECES:
        return "exact (batch-consistent CPU kernels)"
    return "batch-dependent (logits move with the batch width)"
