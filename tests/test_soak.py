"""Soak: one engine session of 2,000 generated tokens with hundreds of rollbacks, on the tiny
SmolLM2 pair; the KV caches stay exact throughout.

Rollbacks come from three places: prompt lookup at temperature 1 (its one-hot drafts are often
rejected), a draft model whose distribution differs from the target's (the tiny model drafting
for itself with its logits scaled, :class:`TemperedDraft`: the tiny pair's own draft is the
target bit for bit and is never rejected), and consecutive generations that share the song's
prefix and then diverge (the cache is trimmed to the shared prefix and reused).

Checked: after every round, the target's cache holds the committed text (all but its last
token) plus exactly the drafts that round rejected; at points during and after generations, the
next-token logits from the cached state equal, bit for bit, those of a new llama.cpp context fed
the same tokens in the same batches (:meth:`KVLog.replay`; batch-consistent kernels make that
exact); the last generation repeats the first (same prompt and seed) after the turns between
have trimmed and refilled the cache, and must give the same tokens, stats and logits; the stats
add up. One thread: on a small shared CPU it is as fast as two, and the test's cost is per token.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from edgespec.core.sampling import SamplingParams
from edgespec.runtime.backend import CONSISTENT_BATCH, LlamaBackend, ModelOptions
from edgespec.runtime.engine import Engine

pytestmark = [pytest.mark.real, pytest.mark.slow]

SONG = "la la la, the sun is up, la la la, the sea is blue,\n" * 4


class TemperedDraft:
    """A draft backend whose logits are scaled by ``factor`` (the sampler then sees a flatter
    or sharper distribution than the target's): a draft that disagrees with the target, whose
    KV cache still goes through llama.cpp's own rollback."""

    def __init__(self, backend: LlamaBackend, factor: float) -> None:
        self._backend, self._factor = backend, np.float32(factor)

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def decode(self, tokens, n_logits):
        return self._backend.decode(tokens, n_logits) * self._factor


class KVLog:
    """Records, for each position a backend's KV cache holds, which ``llama_decode`` batch wrote
    it and whether that batch read logits; counts the cuts that dropped cached tokens."""

    def __init__(self, backend: LlamaBackend) -> None:
        self.backend = backend
        self.cells: list[tuple[int, bool]] = []  #: per cached position: (batch id, logits read)
        self.batch_size: dict[int, int] = {}
        self.rollbacks = 0  #: cuts that dropped cached tokens (rejected drafts, new prompts)
        self.dropped = 0  #: tokens they dropped
        decode, trim = backend.decode, backend.trim

        def logged_decode(tokens, n_logits):
            start = len(backend.tokens)
            out = decode(tokens, n_logits)
            first = len(tokens) - n_logits
            del self.cells[start:]
            for c0, c1 in backend._chunks(len(tokens), first):  # the backend's own batching
                batch = len(self.batch_size)
                self.batch_size[batch] = c1 - c0
                self.cells += [(batch, c0 >= first)] * (c1 - c0)
            return out

        def logged_trim(n):  # every cut of the cache: sync's, and the loop's Follower's
            before = len(backend.tokens)
            n = trim(n)
            if n < before:
                self.rollbacks += 1
                self.dropped += before - n
            del self.cells[n:]
            return n

        backend.decode, backend.trim = logged_decode, logged_trim

    def replay(self) -> np.ndarray:
        """The last cached position's logits from a new context fed the cached tokens in the same
        batches: each prefill batch (no logits) as it was, positions whose logits were read in
        pieces of at most 3 (with batch-consistent kernels each such position gets the same
        result in any piece of up to 3; that is what the engine relies on)."""
        be = self.backend
        tokens = list(be.tokens)
        assert len(self.cells) == len(tokens) and self.cells[-1][1]
        piece = CONSISTENT_BATCH[be.options.repack]
        fresh = LlamaBackend(ModelOptions(path=be.path, n_threads=be.options.n_threads,
                                          n_ctx=be.n_ctx, n_batch=be.options.n_batch))
        try:
            i = 0
            while i < len(tokens):
                batch, with_logits = self.cells[i]
                j = i + 1
                if with_logits:
                    while j < len(tokens) and self.cells[j][1]:
                        j += 1
                    # pieces of at most 3 as the engine's; only the last piece's logits are
                    # needed (the cached K/V do not depend on which rows' logits are read)
                    for p in range(i, j, piece):
                        out = fresh.decode(tokens[p:min(p + piece, j)], 0 if p + piece < j else
                                           min(p + piece, j) - p)
                else:
                    while j < len(tokens) and self.cells[j][0] == batch:
                        j += 1
                    assert self.batch_size[batch] == j - i, "a prefill batch was cut: not replayable"
                    fresh.decode(tokens[i:j], 0)
                i = j
            return out[-1].copy()  # the backend's rows are a view of llama.cpp's buffer
        finally:
            fresh.close()


def next_logits(log: KVLog, context: list[int], *, cached: bool = True) -> np.ndarray:
    """Sync the backend to ``context[:-1]`` (``cached``: it must already hold all of it, no
    catch-up) and score the last token: llama.cpp's logits from the cached state."""
    be = log.backend
    n = be.sync(context[:-1])
    if cached:
        assert n == len(context) - 1 and be.tokens == context[:-1]
    return be.decode(context[n:], 1)[-1].copy()  # the view is only valid until the next decode


def check_kv(log: KVLog, context: list[int], *, cached: bool = True) -> np.ndarray:
    ours = next_logits(log, context, cached=cached)
    np.testing.assert_array_equal(ours, log.replay())
    return ours


def generate(engine, log, prompt, *, check_at=None, **kw):
    """Stream one generation, checking the target's cache after every round; ``check_at``: after
    that many tokens, also compare its logits with a fresh context's, mid-generation.
    Returns the chunks, the committed context and how many rounds had a draft rejected."""
    target = engine.target
    context = engine.prompt_tokens(prompt, chat=False)
    chunks, drafted, accepted, rejections = [], 0, 0, 0
    for chunk in engine.stream(prompt, chat=False, **kw):
        chunks.append(chunk)
        context += [t.id for t in chunk.tokens]
        stats = chunk.stats
        assert stats.generated == sum(len(c.tokens) for c in chunks)
        assert 0 <= stats.accepted <= stats.drafted
        rejected = (stats.drafted - drafted) - (stats.accepted - accepted)  # this round's
        rejections += rejected > 0
        if chunk.finish_reason is None:  # one chunk per round
            # the committed text but its last token, then the drafts this round rejected
            # (dropped by the next round's sync)
            assert target.tokens[: len(context) - 1] == context[:-1]
            assert len(target.tokens) == len(context) - 1 + rejected
            if check_at is not None and stats.generated >= check_at:
                check_kv(log, context)  # the stream goes on from a cache that holds `context`
                check_at = None
        drafted, accepted = stats.drafted, stats.accepted
    assert check_at is None
    return chunks, context, rejections


def assert_stats_add_up(chunks, max_tokens):
    s = chunks[-1].stats
    assert chunks[-1].finish_reason == "length"
    assert s.generated == sum(len(c.tokens) for c in chunks) == max_tokens
    # each round commits its accepted drafts and one more token; none drafts past the budget
    assert s.generated == s.rounds + s.accepted
    assert 0 <= s.accepted <= s.drafted
    assert sum(s.accepted_hist) == sum(s.drafted_hist) == s.rounds
    assert sum(n * c for n, c in enumerate(s.accepted_hist)) == s.accepted
    assert sum(n * c for n, c in enumerate(s.drafted_hist)) == s.drafted
    assert sum(v.rounds for v in s.by_drafter.values()) == s.rounds
    assert sum(v.drafted for v in s.by_drafter.values()) == s.drafted
    assert sum(v.accepted for v in s.by_drafter.values()) == s.accepted
    assert s.time_total >= s.time_prefill >= 0


def ids(chunks) -> list[int]:
    return [t.id for c in chunks for t in c.tokens]


def test_two_thousand_tokens_with_rollbacks_keep_the_kv_cache_exact():
    start = time.perf_counter()
    engine = Engine.load(pair="tiny", drafter="model", n_ctx=2048, n_threads=1, progress=False)
    try:
        # an overconfident draft (logits x3): it proposes its own argmax nearly always, and the
        # target often disagrees, so the draft's cache is rolled back often
        engine.draft = TemperedDraft(engine.draft, 3.0)
        # Sampled text may reach the end-of-text token early, and where depends on the seed, the
        # sampler's draws and the CPU's kernels; this test is about the cache, so every turn runs
        # its whole budget (the end token is then decoded as ordinary text).
        engine.target.is_eog = lambda token: False
        target, draft = KVLog(engine.target), KVLog(engine.draft._backend)
        song = engine.prompt_tokens(SONG, chat=False)
        lookup = SamplingParams(temperature=1.0, seed=11)
        turns = [  # (prompt, drafter, sampling, max_tokens, check the target mid-stream at)
            (SONG, "lookup", lookup, 750, 300),
            (SONG + "The sea said:", "model", SamplingParams(temperature=1.0, seed=12), 250, None),
            (SONG + "And the moon:", "hybrid", SamplingParams(temperature=0.9, top_p=0.95, seed=13),
             250, None),
            (SONG, "lookup", lookup, 750, None),  # the first turn again
        ]
        runs, rejections, seconds = [], 0, []
        for n, (prompt, drafter, params, max_tokens, check_at) in enumerate(turns):
            t0 = time.perf_counter()
            tokens = engine.prompt_tokens(prompt, chat=False)
            assert tokens[: len(song)] == song  # the turns share the song, then diverge
            rollbacks = target.rollbacks
            chunks, context, rejected = generate(engine, target, prompt, check_at=check_at,
                                                 drafter=drafter, draft_length=2, sampling=params,
                                                 max_tokens=max_tokens)
            assert_stats_add_up(chunks, max_tokens)
            # the cache is reused up to where this prompt leaves the previous context
            assert chunks[-1].stats.cached_prompt_tokens >= (0 if n == 0 else len(song) - 1)
            # every rejected round was rolled back (the last one's by the next sync at the latest)
            assert target.rollbacks - rollbacks >= rejected - 1 > 0, n
            rejections += rejected
            runs.append((chunks, context))
            if n == 0:
                first_logits = next_logits(target, context)
            elif n == 1:  # after a turn that reused a trimmed cache; the draft model's cache too
                check_kv(target, context)
                check_kv(draft, context, cached=False)  # the draft lags a token: catch up
            seconds.append(time.perf_counter() - t0)
        # after the other turns trimmed and refilled the cache, the first request gives the
        # same result, bit for bit
        (first, first_ctx), (last, last_ctx) = runs[0], runs[3]
        assert ids(last) == ids(first) and last_ctx == first_ctx
        a, b = first[-1].stats, last[-1].stats
        assert (a.rounds, a.drafted, a.accepted, a.accepted_hist) == (b.rounds, b.drafted, b.accepted,
                                                                      b.accepted_hist)
        np.testing.assert_array_equal(next_logits(target, last_ctx), first_logits)

        total = sum(c[-1].stats.generated for c, _ in runs)
        elapsed = time.perf_counter() - start
        print(f"\nsoak: {total} tokens in {sum(c[-1].stats.rounds for c, _ in runs)} rounds, "
              f"{rejections} with a rejection; {target.rollbacks} target rollbacks "
              f"({target.dropped} tokens dropped), {draft.rollbacks} draft rollbacks; "
              f"{elapsed:.1f} s (turns: {', '.join(f'{t:.1f}' for t in seconds)} s)")
        assert total == 2000
        assert rejections >= 150 and target.rollbacks >= rejections and draft.rollbacks >= 50
    finally:
        engine.close()
