"""Follower: a model's cache kept in step with one growing list, comparing only what is new."""

import numpy as np

from edgespec.core.lookup import common_prefix
from edgespec.runtime.cache import Follower


class Model:
    """A KV cache as a token list, with the backend's sync and trim; counts full syncs."""

    def __init__(self, trim=True):
        self.tokens, self.full_syncs = [], 0
        if not trim:
            self.trim = None

    def sync(self, prefix):
        self.full_syncs += 1
        return self.trim_to(common_prefix(self.tokens, prefix))

    def trim_to(self, n):
        del self.tokens[n:]
        return len(self.tokens)

    def trim(self, n):
        return self.trim_to(n)


def test_a_follower_answers_as_a_full_sync_through_a_generation_of_rounds():
    """Rounds as the loop and the draft model make them, at random: the committed list grows
    by accepted drafts and a token, the cache holds it plus drafts of which some were
    rejected, and syncs ask for the committed list less the last token or all of it. After
    the first round each answer and the cache equal what a full sync gives, with no full
    sync at all."""
    rng = np.random.default_rng(3)
    for case in range(200):
        source = [int(x) for x in rng.integers(0, 50, int(rng.integers(1, 40)))]
        model, reference = Model(), Model()
        follower = Follower(model)
        for _ in range(int(rng.integers(1, 30))):
            n = len(source) - int(rng.integers(0, 2))
            got = follower.sync(source, n)
            want = reference.sync(source[:n])
            assert got == want and model.tokens == reference.tokens, case
            drafts = [int(x) for x in rng.integers(0, 50, int(rng.integers(0, 6)))]
            fed = source[len(model.tokens):] + drafts
            model.tokens += fed  # decode: what was missing, then drafts
            reference.tokens += fed
            accepted = int(rng.integers(0, len(fed) + 1))
            source += fed[:accepted] + [int(rng.integers(0, 50))]  # the verdict
        assert model.full_syncs == 1, case


def test_another_list_a_shorter_cache_or_no_trim_is_a_full_sync():
    model = Model()
    follower = Follower(model)
    first = [1, 2, 3, 4]
    assert follower.sync(first, 4) == 0 and model.full_syncs == 1
    model.tokens += first
    assert follower.sync(first, 3) == 3 and model.full_syncs == 1 and model.tokens == [1, 2, 3]
    other = [1, 2, 9, 9]  # another list (a new generation): compared in full
    assert follower.sync(other, 4) == 2 and model.full_syncs == 2
    model.tokens += [9, 9]
    assert follower.sync(other, 4) == 4 and model.full_syncs == 2  # only the new tokens
    model.tokens.clear()  # someone else used the model: what was verified is gone
    assert follower.sync(other, 4) == 0 and model.full_syncs == 3
    plain = Model(trim=False)  # a model without trim: every call is a full sync
    lone = Follower(plain)
    lone.sync(first, 4)
    lone.sync(first, 4)
    assert plain.full_syncs == 2
