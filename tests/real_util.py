"""Helpers for tests on real llama.cpp models."""

from __future__ import annotations

from edgespec.bench import verify
from edgespec.core.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0)
first_divergence = verify.first_divergence

batch_noise = verify.batch_noise


def ids(completion) -> list[int]:
    return [t.id for t in completion.tokens]


def top2_gap(engine, context: list[int]) -> float:
    """The target's top-2 logit gap after ``context``, as plain decoding scores it."""
    return verify.top2_gap(engine, context)
