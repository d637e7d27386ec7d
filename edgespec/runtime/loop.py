"""The speculative decoding loop: draft, score in one batch, verify, repeat.

Invariant between rounds: the target's KV cache holds every committed token but the last one.
A round feeds ``[last committed token] + drafts`` in one call and reads k + 1 rows of logits:
row i scores draft i, the last row gives the bonus token. After the verdict the cache is cut
back to the accepted prefix on the next round's ``sync`` (the invariant again).

The loop only needs ``sync`` / ``decode`` from the target, so unit tests drive it with
scripted fakes, and the real engine with :class:`edgespec.runtime.backend.LlamaBackend`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator, Protocol, Sequence

import numpy as np

from ..core.dist import AnyDist
from ..core.rejection import Source, verify, verify_greedy
from ..core.sampling import SamplingParams, distribution, pending_distribution
from ..core.stats import Stats
from .cache import Follower
from .drafters import Drafter, Outcome


class Target(Protocol):
    n_ctx: int
    tokens: list[int]

    def sync(self, prefix: Sequence[int]) -> int: ...

    def decode(self, tokens: Sequence[int], n_logits: int) -> np.ndarray: ...

    # Optional: ``decode_argmax(tokens, n_logits)``, each row's arg-max id only. Greedy rounds
    # use it when present: the target's picks are all a greedy verdict needs.


@dataclass(frozen=True)
class Round:
    """Tokens one verification round emitted, with where each came from."""

    tokens: list[int]
    sources: list[Source]
    drafter: str
    drafted: int
    accepted: int


class _ProcessedRows:
    """Target rows processed on first access: rows after a rejection are never computed.

    A row that scores a draft is made :func:`~edgespec.core.sampling.pending_distribution`
    (the test usually decides from bounds, with no pass of ``exp`` over it); the last row is
    always sampled (the bonus token, or the plain step's token) and is processed at once."""

    def __init__(self, logits: np.ndarray, params: SamplingParams) -> None:
        self._logits = logits
        self._params = params
        self._rows: dict[int, AnyDist] = {}

    def __len__(self) -> int:
        return self._logits.shape[0]

    def __getitem__(self, i: int) -> AnyDist:
        row = self._rows.get(i)
        if row is None:
            make = distribution if i == len(self) - 1 else pending_distribution
            row = self._rows[i] = make(self._logits[i], self._params)
        return row


def prefill(target: Target, prompt: Sequence[int]) -> int:
    """Bring the target's cache to ``prompt[:-1]``; return how many tokens were already cached."""
    cached = target.sync(prompt[:-1])
    if cached < len(prompt) - 1:
        target.decode(prompt[cached:-1], 0)
    return cached


def rounds(
    target: Target,
    drafter: Drafter,
    prompt: Sequence[int],
    params: SamplingParams,
    rng: np.random.Generator,
    draft_length: int,
    stats: Stats,
    max_new_tokens: int | None = None,
) -> Iterator[Round]:
    """Yield verification rounds until the context is full (the caller stops on anything else).

    ``max_new_tokens`` only caps how much is drafted: a round never drafts past the budget.

    On a GPU a plain step costs ~2 ms, and what Python does between two decodes runs in the
    cold caches a decode leaves, where each call or object made costs several µs (10-15 µs
    for a dataclass on this project's CPU VM): so the per-round work is kept to what a round
    needs, e.g. a greedy plain step makes no verdict.
    """
    committed = list(prompt)
    cache = Follower(target)
    emitted = 0
    picks = getattr(target, "decode_argmax", None) if params.greedy else None
    observe = getattr(drafter, "observe", None)
    draft_source, target_source = Source.DRAFT, Source.TARGET
    while len(committed) < target.n_ctx:
        # Feeding [last] + k drafts needs len(committed) + k cells; capping one lower also keeps
        # the emitted length at exactly n_ctx for every drafter (plain decoding stops there too).
        k = min(draft_length, target.n_ctx - len(committed) - 1)
        if max_new_tokens is not None:
            k = min(k, max(max_new_tokens - emitted - 1, 0))

        t0 = time.perf_counter()
        draft = drafter.propose(committed, k, params, rng) if k > 0 else None
        tokens = draft.tokens[:k] if draft else []
        q = draft.q[: len(tokens)] if draft else []
        t1 = time.perf_counter()

        cache.sync(committed, len(committed) - 1)
        if picks is not None:
            ids = picks([committed[-1], *tokens], len(tokens) + 1)
            t2 = time.perf_counter()
            if tokens:
                verdict = verify_greedy(tokens, ids)
                accepted, token, source = verdict.n_accepted, verdict.next_token, verdict.next_source
            else:  # a greedy plain step: the target's pick (no verdict made; see rounds' note)
                accepted, token, source = 0, int(ids[0]), target_source
        else:
            logits = target.decode([committed[-1], *tokens], len(tokens) + 1)
            t2 = time.perf_counter()
            verdict = verify(tokens, q, _ProcessedRows(logits, params), rng)
            accepted, token, source = verdict.n_accepted, verdict.next_token, verdict.next_source
        t3 = time.perf_counter()

        new = tokens[:accepted] + [token]
        sources = [draft_source] * accepted + [source]
        committed.extend(new)
        emitted += len(new)
        name = draft.source if draft and tokens else "none"
        if observe is not None:
            observe(Outcome(draft, len(tokens), accepted, new, t1 - t0, t2 - t1))
        stats.record_round(name, len(tokens), accepted)
        stats.time_drafting += t1 - t0
        stats.time_target += t2 - t1
        stats.time_sampling += t3 - t2
        yield Round(new, sources, name, len(tokens), accepted)
