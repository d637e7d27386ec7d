"""Helpers for tests on real llama.cpp models."""

from __future__ import annotations

import numpy as np

from edgespec.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0)

#: Largest |logit| difference measured between scoring a token alone and inside a batch of
#: 2..16 with llama.cpp's fast CPU kernels (scripts/batch_consistency.py on the default target:
#: 0.64 worst case over both context lengths and all kernel settings), rounded up.
FAST_KERNEL_NOISE = 0.7


def ids(completion) -> list[int]:
    return [t.id for t in completion.tokens]


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def top2_gap(engine, context: list[int]) -> float:
    """The target's logit gap between its two best next tokens after ``context`` (one token
    scored alone, as plain decoding does)."""
    target = engine.target
    target.sync(context[:-1])
    logits = target.decode(context[-1:], 1)[0]
    top = np.sort(logits)[-2:]
    return float(top[1] - top[0])
