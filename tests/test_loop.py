"""The round loop over scripted fakes: KV bookkeeping, drafting budget, exactness.

The fakes' logits depend on the whole prefix held in their cache (tests/fakes.py), so a round
that decodes at the wrong position or keeps a rejected draft in the cache changes the results;
besides, every decode call is recorded and checked against what the loop should have fed.
"""

from __future__ import annotations

import time
from collections import Counter
from itertools import product

import numpy as np
import pytest

from edgespec.core.lookup import common_prefix
from edgespec.core.rejection import Source
from edgespec.core.sampling import SamplingParams, distribution, make_rng, process
from edgespec.core.stats import Stats
from edgespec.runtime import loop
from edgespec.runtime.drafters import Draft, ModelDrafter, make_drafter
from edgespec.runtime.loop import prefill, rounds

from .fakes import AheadLM, FakeLM, LogitTable, Perturbed, RecurrentLM, Table, pair
from .stats_util import ALPHA, chi2_pvalue

GREEDY = SamplingParams(temperature=0)
T1 = SamplingParams(temperature=1.0)
PROMPT = [1, 2, 3, 4, 5]


class Recorder:
    """Wraps a drafter and keeps every proposal it made (as the loop will see it)."""

    def __init__(self, drafter):
        self.drafter = drafter
        self.name = drafter.name
        self.proposals: list[Draft] = []

    def propose(self, context, k, params, rng):
        draft = self.drafter.propose(context, k, params, rng)
        self.proposals.append(draft)
        return draft


def generate(target, drafter, prompt, params, k, n_tokens, *, seed=0, max_new_tokens=None):
    """Run prefill + rounds until ``n_tokens`` are emitted (or the context is full)."""
    stats = Stats()
    prefill(target, prompt)
    out: list[int] = []
    rnds = []
    for rnd in rounds(target, drafter, prompt, params, make_rng(seed), k, stats, max_new_tokens):
        out += rnd.tokens
        rnds.append(rnd)
        if len(out) >= n_tokens:
            break
    return out[:n_tokens], rnds, stats


# ---- KV bookkeeping ----------------------------------------------------------------------------


@pytest.mark.parametrize("params", [GREEDY, T1], ids=["greedy", "temperature-1"])
def test_target_cache_rolls_back_to_the_accepted_prefix(params):
    target, draft = pair(8, seed=3, draft="perturbed", scale=2.5)
    drafter = Recorder(make_drafter("model", draft, target.n_vocab))
    k = 4
    prefill(target, PROMPT)
    target.reset_log()
    committed = list(PROMPT)
    accepted = Counter()
    gen = rounds(target, drafter, PROMPT, params, make_rng(1), k, Stats())
    for r in range(40):
        rnd = next(gen)
        proposal = drafter.proposals[-1].tokens
        assert len(target.calls) == r + 1  # one target call per round
        call = target.calls[-1]
        # the verify call: [last committed] + drafts, right after committed[:-1], k + 1 rows
        assert call.cache == tuple(committed[:-1])
        assert call.pos == len(committed) - 1
        assert call.tokens == (committed[-1], *proposal)
        assert call.n_logits == len(proposal) + 1 == rnd.drafted + 1
        # what the round emitted: the accepted drafts, then one target token
        a = rnd.accepted
        assert rnd.tokens[:a] == proposal[:a] and len(rnd.tokens) == a + 1
        last = Source.BONUS if a == len(proposal) else Source.CORRECTED
        assert rnd.sources == [Source.DRAFT] * a + [last]
        if a < len(proposal):
            assert rnd.tokens[a] != proposal[a]
        committed += rnd.tokens
        # the cache now holds committed[:-1] plus, at most, the rejected drafts ...
        assert target.tokens[: len(committed) - 1] == committed[:-1]
        assert target.tokens[len(committed) - 1 :] == proposal[a:]
        accepted[a] += 1
    gen.close()
    # ... and the next round's call (checked above) starts from exactly committed[:-1].
    # The run must have seen rejections at the first draft, partial acceptances and full ones.
    assert accepted[0] and accepted[k] and any(accepted[i] for i in range(1, k))


@pytest.mark.parametrize("params", [GREEDY, T1], ids=["greedy", "temperature-1"])
def test_draft_model_cache_reuses_accepted_and_drops_rejected(params):
    target, draft = pair(8, seed=3, draft="perturbed", scale=2.5)
    drafter = Recorder(make_drafter("model", draft, target.n_vocab))
    k = 4
    prefill(target, PROMPT)
    committed = list(PROMPT)
    prev = None
    seen = Counter()
    gen = rounds(target, drafter, PROMPT, params, make_rng(2), k, Stats())
    for _ in range(40):
        n_before = len(draft.calls)
        rnd = next(gen)
        calls = draft.calls[n_before:]
        proposal = drafter.proposals[-1].tokens
        assert len(proposal) == k and len(calls) == k  # one catch-up call + k - 1 draft steps
        first = calls[0]
        if prev is None:
            assert (first.pos, first.tokens) == (0, tuple(PROMPT))  # nothing cached yet
        elif prev.accepted == prev.drafted:
            # all accepted: the last draft was never decoded by the draft model; feed it + bonus
            assert first.tokens == tuple(committed[-2:])
            seen["all"] += 1
        else:
            # rejected: the accepted drafts are still cached; only the correction is new
            assert first.tokens == tuple(committed[-1:])
            seen["rejected"] += 1
        assert first.cache == tuple(committed[: first.pos]) and first.n_logits == 1
        assert first.pos + len(first.tokens) == len(committed)
        for i, c in enumerate(calls[1:]):  # then one token per step: the previous draft
            assert c.tokens == (proposal[i],) and c.n_logits == 1
            assert c.pos == len(committed) + i
        committed += rnd.tokens
        prev = rnd
    gen.close()
    assert seen["all"] and seen["rejected"]
    # Nothing decoded twice: the draft model fed the prompt once, and per round k - 1 draft
    # steps plus one or two catch-up tokens.
    assert draft.decoded == len(PROMPT) + 40 * (k - 1) + seen["rejected"] + 2 * seen["all"]


def test_prefill_decodes_only_what_is_not_cached():
    target, _ = pair(8)
    assert prefill(target, PROMPT) == 0
    assert [(c.pos, c.tokens, c.n_logits) for c in target.calls] == [(0, tuple(PROMPT[:-1]), 0)]
    assert target.tokens == PROMPT[:-1]
    target.reset_log()
    assert prefill(target, PROMPT + [6, 7]) == len(PROMPT) - 1  # shared prefix kept
    assert [(c.pos, c.tokens) for c in target.calls] == [(4, (5, 6))]
    target.reset_log()
    assert prefill(target, PROMPT + [6, 7]) == len(PROMPT) + 1  # fully cached: no call
    assert target.calls == []
    assert prefill(target, [3]) == 0 and target.tokens == [] and target.calls == []


# ---- all drafts accepted -----------------------------------------------------------------------


@pytest.mark.parametrize("params", [GREEDY, T1], ids=["greedy", "temperature-1"])
def test_draft_equal_to_target_gets_every_draft_and_a_bonus(params):
    target, draft = pair(8, seed=7, draft="same")
    k = 4
    _, rnds, stats = generate(target, make_drafter("model", draft, 8), PROMPT, params, k, 50, seed=3)
    assert len(rnds) == 10
    for rnd in rnds:
        assert (rnd.drafted, rnd.accepted, len(rnd.tokens)) == (k, k, k + 1)
        assert rnd.sources == [Source.DRAFT] * k + [Source.BONUS]
    assert stats.acceptance_rate == 1.0 and stats.accepted_hist == [0, 0, 0, 0, 10]


# ---- exactness: greedy speculative == greedy plain ---------------------------------------------


def _greedy_setup(seed=11):
    # Markov-heavy table: the greedy text loops, so prompt lookup finds (right and wrong) matches.
    target, draft = pair(8, seed=seed, draft="perturbed", scale=1.2, markov=2.5, context=1.0)
    return target, draft


@pytest.mark.parametrize("name", ["model", "lookup", "hybrid"])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_speculative_equals_greedy_plain(name, k):
    target, _ = _greedy_setup()
    plain, _, _ = generate(target, make_drafter("none"), PROMPT, GREEDY, k, 120)
    target, draft = _greedy_setup()
    spec, _, stats = generate(target, make_drafter(name, draft, 8), PROMPT, GREEDY, k, 120)
    assert spec == plain
    # the comparison means something only if drafts were both accepted and rejected
    assert 0 < stats.accepted < stats.drafted
    if name == "hybrid":
        assert stats.by_drafter["lookup"].drafted and stats.by_drafter["model"].drafted


@pytest.mark.parametrize("name", ["model", "lookup", "hybrid"])
@pytest.mark.parametrize("reach,k", [(1, 3), (2, 3), (2, 8)])
def test_a_recurrent_target_plays_long_drafts_in_calls_it_can_take_back(name, reach, k):
    """A target that can take back only ``reach`` tokens of its last call (the fake fails any
    other cut): a round of k > reach drafts is played in calls of reach + 1 judged drafts,
    and greedy output still equals plain decoding's."""
    target, _ = _greedy_setup()
    plain, _, _ = generate(target, make_drafter("none"), PROMPT, GREEDY, k, 120)
    table, draft = _greedy_setup()
    target = RecurrentLM(table.table, reach=reach)
    spec, _, stats = generate(target, make_drafter(name, draft, 8), PROMPT, GREEDY, k, 120)
    assert spec == plain
    assert 0 < stats.accepted < stats.drafted and target.rollbacks
    assert max(len(c.tokens) for c in target.calls[1:]) <= reach + 1  # (after the prefill)


def test_greedy_equality_survives_reused_caches():
    # The same target and draft serve several generations (prefix reuse by sync).
    target, draft = _greedy_setup()
    fresh, _ = _greedy_setup()
    drafter = make_drafter("hybrid", draft, 8)
    for prompt in (PROMPT, PROMPT + [0], PROMPT[:3], PROMPT):
        want, _, _ = generate(fresh, make_drafter("none"), prompt, GREEDY, 4, 40)
        got, _, _ = generate(target, drafter, prompt, GREEDY, 4, 40)
        assert got == want


class Resized(LogitTable):
    """``base`` over ``n_vocab`` ids: cut, or padded with -inf (padding rows, never sampled)."""

    def __init__(self, base, n_vocab):
        super().__init__()
        self.base, self.n_vocab = base, n_vocab

    def _compute(self, prefix):
        row = np.full(self.n_vocab, -np.inf)
        n = min(self.n_vocab, self.base.n_vocab)
        row[:n] = self.base(prefix)[:n]
        return row


@pytest.mark.parametrize("draft_vocab", [6, 10])
@pytest.mark.parametrize("params", [GREEDY, T1], ids=["greedy", "temperature-1"])
def test_draft_vocabulary_of_another_size_is_mapped_id_for_id(draft_vocab, params):
    # ModelDrafter maps the draft's logits onto the target's 8 ids: cut when the draft has more,
    # padded with -inf when it has fewer. Here the draft is the target on the shared ids (as
    # with real padded vocabularies, the target never emits ids the smaller draft lacks), so
    # a correct mapping gets every draft accepted, and the output is the plain one.
    table = Table(8, 11, markov=2.5, banned=range(draft_vocab, 8))
    draft = FakeLM(Resized(table, draft_vocab))
    plain, _, _ = generate(FakeLM(table), make_drafter("none"), PROMPT, params, 4, 60, seed=4)
    spec, _, stats = generate(FakeLM(table), make_drafter("model", draft, 8), PROMPT, params, 4, 60,
                              seed=4)
    if params.greedy:
        assert spec == plain
    assert stats.drafted and stats.acceptance_rate == 1.0
    assert all(t < min(8, draft_vocab) for t in spec)


class NoRollbackLM(FakeLM):
    """A backend that reports the trim but keeps the rejected drafts in its KV cache."""

    def sync(self, prefix):
        self.syncs.append(tuple(prefix))
        return common_prefix(self.tokens, prefix)

    def trim(self, n):
        return min(n, len(self.tokens))


def test_negative_control_the_fake_exposes_a_missing_rollback():
    # The equality test above is only meaningful if bad bookkeeping changes the output.
    target, draft = _greedy_setup()
    plain, _, _ = generate(target, make_drafter("none"), PROMPT, GREEDY, 4, 120)
    broken = NoRollbackLM(target.table, n_ctx=4096)
    spec, _, _ = generate(broken, make_drafter("model", draft, 8), PROMPT, GREEDY, 4, 120)
    assert spec != plain


# ---- context limit and budget ------------------------------------------------------------------


@pytest.mark.parametrize("name,draft_kind", [("none", "same"), ("lookup", "same"),
                                             ("model", "same"), ("model", "perturbed"),
                                             ("hybrid", "perturbed")])
def test_rounds_fill_the_context_and_stop(name, draft_kind):
    n_ctx, k, prompt = 40, 4, [1, 2, 3, 4, 5, 6, 7]
    target, draft = pair(8, seed=13, draft=draft_kind, n_ctx=n_ctx, markov=2.5)
    committed = list(prompt)
    prefill(target, prompt)
    n_rounds = 0
    for rnd in rounds(target, make_drafter(name, draft, 8), prompt, GREEDY, make_rng(0), k, Stats()):
        assert rnd.drafted <= min(k, n_ctx - len(committed) - 1)  # k shrinks near the end
        committed += rnd.tokens
        n_rounds += 1
        assert n_rounds < 100
    # the generator ended by itself, with the context full and no call past it
    assert len(committed) == n_ctx  # exactly full, whatever the drafter
    assert max(c.pos + len(c.tokens) for c in target.calls) <= n_ctx
    assert max(c.pos + len(c.tokens) for c in draft.calls or [target.calls[0]]) <= n_ctx
    if (name, draft_kind) == ("model", "same"):
        # 7 -> 12 -> ... -> 37, then a last round drafting only n_ctx - 37 - 1 = 2 tokens
        assert rnd.drafted == 2 and len(committed) == n_ctx


def test_draft_model_with_smaller_context_stops_drafting_not_generating():
    target, draft = pair(8, seed=13, draft="same", n_ctx=60, draft_n_ctx=20, markov=2.5)
    plain, _, _ = generate(pair(8, seed=13, n_ctx=60, markov=2.5)[0], make_drafter("none"),
                           PROMPT, GREEDY, 4, 200)
    spec, rnds, _ = generate(target, make_drafter("model", draft, 8), PROMPT, GREEDY, 4, 200)
    assert spec[: len(plain)] == plain
    assert max(c.pos + len(c.tokens) for c in draft.calls) <= 20
    assert rnds[0].drafted == 4 and rnds[-1].drafted == 0  # drafting stopped at the draft's limit


def test_context_full_output_does_not_depend_on_the_drafter():
    n_ctx, prompt = 40, [1, 2, 3, 4, 5, 6, 7]
    outs = {}
    for name in ("none", "model"):
        target, draft = pair(8, seed=13, draft="same", n_ctx=n_ctx, markov=2.5)
        outs[name], _, _ = generate(target, make_drafter(name, draft, 8), prompt, GREEDY, 4, 10**6)
    assert outs["model"] == outs["none"]


@pytest.mark.parametrize("max_new", [1, 2, 4, 5, 6, 7, 10, 11, 13])
def test_max_new_tokens_caps_drafting(max_new):
    # draft == target: every draft is accepted, so a round emits exactly drafted + 1 tokens
    target, draft = pair(8, seed=7, draft="same")
    k = 4
    emitted = 0
    prefill(target, PROMPT)
    gen = rounds(target, make_drafter("model", draft, 8), PROMPT, GREEDY, make_rng(0), k, Stats(), max_new)
    for _ in range(8):
        rnd = next(gen)
        budget = max(max_new - emitted - 1, 0)
        assert rnd.drafted == min(k, budget)
        if emitted < max_new:
            assert emitted + len(rnd.tokens) <= max_new  # never past the budget ...
        emitted += len(rnd.tokens)
        if emitted >= max_new:
            break
    gen.close()
    assert emitted == max_new  # ... and exactly on it


# ---- exactness at temperature > 0: the joint of the first three tokens -------------------------
#
# V = 4 tokens, 3 generated tokens: 64 outcomes; N = 6,000 runs of `rounds` with k = 3 (so one
# round can emit all three, and corrections at every draft position occur). The target's exact
# joint comes from its table through `process`. Expected counts average ~94 per outcome (rare
# ones are pooled by chi2_pvalue); at ALPHA = 1e-4 both negative controls below (a target that
# keeps rejected drafts in its cache, and a loop reading the target's rows one position late)
# fail with p-values that underflow to 0 at this N, so the threshold has a wide margin.

STAT_MODES = {"temperature-1": T1, "top-p-0.8": SamplingParams(temperature=1.0, top_p=0.8)}
STAT_PROMPT = [0, 1, 2]
N_STAT = 6_000
STAT_TABLE = Table(4, 21, markov=0.5, context=1.0)


def _stat_pair():
    return FakeLM(STAT_TABLE), FakeLM(Perturbed(STAT_TABLE, 22, 2.0))


def _first_three(target, drafter, params, n, seed, paths=None, new_target=None):
    """The first three tokens of n generations (one shared rng); ``paths`` tallies the first
    round's (accepted, last source). ``new_target`` makes a fresh target per generation."""
    rng = make_rng(seed)
    seqs = []
    for _ in range(n):
        if new_target is not None:
            target = new_target()
        prefill(target, STAT_PROMPT)
        out: list[int] = []
        gen = rounds(target, drafter, STAT_PROMPT, params, rng, 3, Stats())
        for rnd in gen:
            if paths is not None and not out:
                paths[(rnd.accepted, rnd.sources[-1])] += 1
            out += rnd.tokens
            if len(out) >= 3:
                break
        gen.close()
        seqs.append(tuple(out[:3]))
    return Counter(seqs)


def _exact_joint(params):
    probs = {}
    for seq in product(range(4), repeat=3):
        pr = 1.0
        for i, t in enumerate(seq):
            pr *= process(STAT_TABLE(STAT_PROMPT + list(seq[:i])), params)[t]
        probs[seq] = pr
    return probs


@pytest.mark.parametrize("mode", STAT_MODES)
def test_joint_of_first_three_tokens_is_the_targets(mode):
    params = STAT_MODES[mode]
    target, draft = _stat_pair()
    paths = Counter()
    counts = _first_three(target, make_drafter("model", draft, 4), params, N_STAT, 31, paths)
    assert sum(counts.values()) == N_STAT
    assert chi2_pvalue(counts, _exact_joint(params)) > ALPHA
    # the test is only as good as the paths it walked: corrections at each draft, and bonuses
    for a in range(3):
        assert paths[(a, Source.CORRECTED)] > 100
    assert paths[(3, Source.BONUS)] > 100


@pytest.mark.parametrize("mode", STAT_MODES)
def test_a_round_played_in_calls_keeps_the_joint_the_targets(mode):
    """Three drafts on a target that takes back one token of its last call: two calls judge
    them (no bonus between), and the first three tokens keep the target's law."""
    params = STAT_MODES[mode]
    targets: list[RecurrentLM] = []

    def fresh() -> RecurrentLM:  # (a new text: a real context reads from a checkpoint)
        targets.append(RecurrentLM(STAT_TABLE, reach=1))
        return targets[-1]

    draft = FakeLM(Perturbed(STAT_TABLE, 22, 2.0))
    counts = _first_three(None, make_drafter("model", draft, 4), params, N_STAT, 33,
                          new_target=fresh)
    assert chi2_pvalue(counts, _exact_joint(params)) > ALPHA
    assert sum(len(t.rollbacks) for t in targets) > 1000


@pytest.mark.parametrize("mode", STAT_MODES)
def test_a_windowed_draft_keeps_the_joint_the_targets(mode):
    # The draft proposes from its 2 most likely of 4 tokens (a q other than its processed row):
    # the exact test holds for any q it really sampled from. Same N and threshold as above.
    params = STAT_MODES[mode]
    target, draft = _stat_pair()
    drafter = Recorder(ModelDrafter(draft, 4, window=2))
    paths = Counter()
    counts = _first_three(target, drafter, params, N_STAT, 37, paths)
    assert chi2_pvalue(counts, _exact_joint(params)) > ALPHA
    assert all(np.count_nonzero(q.dense()) <= 2 for d in drafter.proposals for q in d.q)
    for a in range(3):
        assert paths[(a, Source.CORRECTED)] > 100


class DeviceWindow(FakeLM):
    """A draft that takes its window "on the device" (``decode_window``), as a GPU's does,
    here as each row's ``w`` largest logits by a stable sort, handed out in reverse id order."""

    device_window = True

    def __init__(self, table):
        super().__init__(table)
        self.windows = 0

    def decode(self, tokens, n_logits):
        assert not n_logits, "a row of logits reached the host"
        return super().decode(tokens, n_logits)

    def decode_window(self, tokens, n_logits, w):
        rows = super().decode(tokens, n_logits)
        self.windows += n_logits
        ids = np.argsort(-rows, axis=1, kind="stable")[:, :w][:, ::-1].astype(np.int32)
        return ids, np.take_along_axis(rows, ids, axis=1)


@pytest.mark.parametrize("mode", STAT_MODES)
def test_a_draft_window_taken_on_the_device_keeps_the_joint_the_targets(mode):
    params = STAT_MODES[mode]
    target = FakeLM(STAT_TABLE)
    draft = DeviceWindow(Perturbed(STAT_TABLE, 22, 2.0))
    paths = Counter()
    counts = _first_three(target, ModelDrafter(draft, 4, window=2), params, N_STAT, 41, paths)
    assert chi2_pvalue(counts, _exact_joint(params)) > ALPHA
    assert draft.windows > N_STAT
    for a in range(3):
        assert paths[(a, Source.CORRECTED)] > 100


def test_a_device_window_of_padding_ids_only_stops_the_draft():
    class Padding(DeviceWindow):
        def decode_window(self, tokens, n_logits, w):
            ids, logits = super().decode_window(tokens, n_logits, w)
            return ids + 4, logits  # every id past the target's 4 tokens

    draft = Padding(Perturbed(STAT_TABLE, 22, 2.0))
    draft.sync([])
    out = ModelDrafter(draft, 4, window=2).propose(STAT_PROMPT, 3, T1, make_rng(0))
    assert out.tokens == [] and draft.windows == 1


def test_negative_control_a_windowed_draft_reporting_its_whole_row():
    # Tokens drawn from the window but tested against the whole row's q: no longer exact.
    class Misreported(ModelDrafter):
        def propose(self, context, k, params, rng):
            draft = super().propose(context, k, params, rng)
            table = self.model.table
            draft.q = [distribution(table(list(context) + draft.tokens[:i]), params)
                       for i in range(len(draft.tokens))]
            return draft

    target, draft = _stat_pair()
    counts = _first_three(target, Misreported(draft, 4, window=2), T1, N_STAT, 37)
    assert chi2_pvalue(counts, _exact_joint(T1)) < ALPHA


def test_negative_control_target_keeps_rejected_drafts():
    # A fresh target per generation: this broken one cannot even trim back to the prompt.
    _, draft = _stat_pair()
    counts = _first_three(None, make_drafter("model", draft, 4), T1, N_STAT, 31,
                          new_target=lambda: NoRollbackLM(STAT_TABLE, n_ctx=64))
    assert chi2_pvalue(counts, _exact_joint(T1)) < ALPHA


def test_negative_control_target_rows_read_one_position_late(monkeypatch):
    class Late(loop._ProcessedRows):
        def __getitem__(self, i):
            return super().__getitem__(min(i + 1, len(self) - 1))

    monkeypatch.setattr(loop, "_ProcessedRows", Late)
    target, draft = _stat_pair()
    counts = _first_three(target, make_drafter("model", draft, 4), T1, N_STAT, 31)
    assert chi2_pvalue(counts, _exact_joint(T1)) < ALPHA


# ---- the auto drafter: any mix of sources and lengths stays exact ------------------------------

GPU_LIKE = {1: 0.010, 4: 0.011, 16: 0.014}  # scoring is nearly free: auto drafts a lot


@pytest.fixture
def frozen_costs(monkeypatch):
    """Costs that do not follow the wall clock, so auto's choices are reproducible."""
    from edgespec.core.costs import CallCosts
    from edgespec.core.policy import CostEstimate

    monkeypatch.setattr(CallCosts, "observe", lambda self, width, last, run, seconds: None)
    monkeypatch.setattr(CostEstimate, "observe", lambda self, s: None)


def _auto(draft, n_vocab, curve=GPU_LIKE, draft_cost=0.002):
    from edgespec.core.costs import CallCosts, CostCurve
    from edgespec.core.policy import CostEstimate, Policy

    policy = Policy(CallCosts(CostCurve(dict(curve))),
                    CostEstimate(draft_cost) if draft is not None else None)
    return make_drafter("auto", draft, n_vocab, policy=policy)


@pytest.mark.parametrize("cap", [3, 16])
def test_auto_greedy_equals_greedy_plain(cap, frozen_costs):
    target, _ = _greedy_setup()
    plain, _, _ = generate(target, make_drafter("none"), PROMPT, GREEDY, cap, 150)
    target, draft = _greedy_setup()
    drafter = _auto(draft, 8)
    spec, _, stats = generate(target, drafter, PROMPT, GREEDY, cap, 150)
    assert spec == plain
    assert 0 < stats.accepted < stats.drafted
    assert stats.by_drafter["lookup"].drafted and stats.by_drafter["model"].drafted
    assert max(drafter.choices) <= cap and len(drafter.choices) > 1  # it varied k


def test_auto_on_linear_costs_decodes_plainly_and_never_drafts_the_model(frozen_costs):
    target, draft = _greedy_setup()
    cpu = {1: 0.05, 2: 0.1, 8: 0.4, 16: 0.8}  # per-call cost exactly proportional to tokens
    drafter = _auto(draft, 8, curve=cpu, draft_cost=0.02)
    plain, _, _ = generate(_greedy_setup()[0], make_drafter("none"), PROMPT, GREEDY, 8, 80)
    spec, _, stats = generate(target, drafter, PROMPT, GREEDY, 8, 80)
    assert spec == plain
    assert draft.calls == []  # not one draft-model call
    # nor a lookup round: scoring k more tokens costs k plain steps, more than any draft gives
    assert stats.drafted == 0 and drafter.choices == {0: sum(drafter.choices.values())}


@pytest.mark.parametrize("mode", STAT_MODES)
def test_auto_joint_of_first_three_tokens_is_the_targets(mode, frozen_costs):
    # Same N and threshold as above. auto's state (acceptance estimates) carries over from one
    # generation to the next, so the choice of source and k varies with the sampled past.
    params = STAT_MODES[mode]
    target, draft = _stat_pair()
    drafter = _auto(draft, 4, draft_cost=0.001)
    counts = _first_three(target, drafter, params, N_STAT, 33)
    assert chi2_pvalue(counts, _exact_joint(params)) > ALPHA
    assert len(drafter.choices) >= 3  # several draft lengths were played


class Picking:
    """A fake target or draft that also answers ``decode_argmax`` (as LlamaBackend does), and
    counts the rows of logits it handed out."""

    def __init__(self, lm):
        self.lm = lm
        self.n_ctx = lm.n_ctx
        self.rows = 0
        self.picked = 0

    @property
    def tokens(self):
        return self.lm.tokens

    def sync(self, prefix):
        return self.lm.sync(prefix)

    def decode(self, tokens, n_logits):
        self.rows += n_logits
        return self.lm.decode(tokens, n_logits)

    def decode_argmax(self, tokens, n_logits):
        self.picked += n_logits
        return np.argmax(self.lm.decode(tokens, n_logits), axis=1).astype(np.int32)


@pytest.mark.parametrize("name", ["none", "model", "lookup", "hybrid"])
def test_greedy_rounds_use_picks_and_give_the_same_rounds(name):
    target, draft = _greedy_setup()
    want, want_rounds, _ = generate(target, make_drafter(name, draft, 8), PROMPT, GREEDY, 4, 80)
    target, draft = _greedy_setup()
    t, d = Picking(target), Picking(draft)
    got, got_rounds, _ = generate(t, make_drafter(name, d, 8), PROMPT, GREEDY, 4, 80)
    assert got == want and got_rounds == want_rounds
    assert t.rows == 0 and t.picked >= 80  # no target row reached the loop
    if name in ("model", "hybrid"):
        assert d.rows == 0 and d.picked > 0
    # sampled rounds still read rows
    target, draft = _greedy_setup()
    t = Picking(target)
    generate(t, make_drafter(name, Picking(draft), 8), PROMPT, T1, 4, 20)
    assert t.picked == 0 and t.rows >= 20


def test_greedy_draft_stops_at_a_pick_past_the_targets_vocabulary():
    # The draft's vocabulary has 4 padding ids past the target's 8; when the draft model's
    # pick is one of them, the draft ends there (the target could not score it).
    target, _ = pair(8, seed=3)
    draft_table = Table(12, seed=3)
    draft = FakeLM(draft_table, n_ctx=256)

    class PadPicks(Picking):
        def decode_argmax(self, tokens, n_logits):
            ids = super().decode_argmax(tokens, n_logits)
            return np.where(np.arange(len(self.lm.tokens))[-n_logits:] % 3 == 2, 9, ids)

    drafter = make_drafter("model", PadPicks(draft), 8)
    target.decode(PROMPT[:-1], 0)
    got = drafter.propose(list(PROMPT), 6, GREEDY, make_rng(0))
    assert got.tokens and len(got.tokens) < 6 and all(t < 8 for t in got.tokens)
    assert got.q == [None] * len(got.tokens)


@pytest.mark.parametrize("behind", [1, 2, 4, 6])
def test_on_a_gpu_a_short_catch_up_goes_one_token_a_call_and_drafts_the_same(behind):
    """A draft model whose calls replay a CUDA graph only at a repeated width (a GPU) takes the
    tokens committed since it last decoded one per call, up to SINGLE_CATCHUP of them, so its
    calls keep the drafting width of 1; a longer catch-up is one call. The drafts are the
    same either way, and on the CPU the catch-up stays one call."""
    from edgespec.runtime.drafters import SINGLE_CATCHUP

    table = Table(16, 3)
    context = [int(t) for t in np.random.default_rng(5).integers(0, 16, 30)]
    params, drafts, widths = SamplingParams(temperature=0), {}, {}
    for gpu in (False, True):
        draft = FakeLM(table, n_ctx=64)
        draft.graph_shapes = gpu
        draft.decode(context[: len(context) - behind], 0)
        draft.reset_log()
        drafts[gpu] = ModelDrafter(draft, 16).propose(context, 3, params, make_rng(0)).tokens
        widths[gpu] = [len(c.tokens) for c in draft.calls]
    assert drafts[True] == drafts[False] and len(drafts[True]) == 3
    assert widths[False] == [behind, 1, 1]
    if behind <= SINGLE_CATCHUP:
        assert widths[True] == [1] * (behind + 2)
    else:
        assert widths[True] == [behind, 1, 1]


# ---- an asynchronous target: the next round launched before this one is yielded ---------------


def _ahead(lm: FakeLM) -> AheadLM:
    """The same model, with decodes that start and finish apart (a GPU's, RPC workers')."""
    return AheadLM(lm.table, n_ctx=lm.n_ctx, eog=lm.eog)


@pytest.mark.parametrize("name", ["none", "lookup", "model", "hybrid"])
@pytest.mark.parametrize("params", [GREEDY, T1], ids=["greedy", "temperature-1"])
def test_launching_ahead_plays_the_same_rounds(name, params):
    target, draft = _greedy_setup()
    want, want_rounds, want_stats = generate(target, make_drafter(name, draft, 8), PROMPT, params, 4, 100)
    target, draft = _greedy_setup()
    ahead = _ahead(target)
    got, got_rounds, stats = generate(ahead, make_drafter(name, draft, 8), PROMPT, params, 4, 100)
    assert got == want and got_rounds == want_rounds
    assert (stats.drafted, stats.accepted) == (want_stats.drafted, want_stats.accepted)
    # every round's call was launched ahead (the first with nothing to overlap)
    assert sum(e[0] == "start" for e in ahead.events) >= len(got_rounds)


def test_the_next_round_is_launched_before_this_one_is_yielded_and_closing_waits_for_it():
    target, draft = _greedy_setup()
    ahead = _ahead(target)
    prefill(ahead, PROMPT)
    committed = list(PROMPT)
    gen = rounds(ahead, make_drafter("hybrid", draft, 8), PROMPT, GREEDY, make_rng(0), 4, Stats())
    for _ in range(12):
        committed += next(gen).tokens
        # the caller holds this round while the next one's call runs: [last] + its drafts
        assert ahead.in_flight and ahead.events[-1][0] == "start"
        assert ahead.tokens[:len(committed)] == committed
        assert len(ahead.tokens) == len(committed) - 1 + ahead.events[-1][1]
    gen.close()
    assert not ahead.in_flight and ahead.events[-1] == ("finish",)  # waited for, not read
    # its tokens stay in the cache's record; the next generation cuts them off
    got, _, _ = generate(ahead, make_drafter("lookup"), committed, GREEDY, 4, 40)
    fresh, _ = _greedy_setup()
    want, _, _ = generate(fresh, make_drafter("lookup"), committed, GREEDY, 4, 40)
    assert got == want


@pytest.mark.parametrize("max_new", [1, 3, 7, 12])
def test_nothing_is_launched_past_the_budget(max_new):
    target, draft = pair(8, seed=7, draft="same")
    ahead = _ahead(target)
    prefill(ahead, PROMPT)
    gen = rounds(ahead, make_drafter("model", draft, 8), PROMPT, GREEDY, make_rng(0), 4, Stats(),
                 max_new)
    emitted = 0
    while emitted < max_new:
        emitted += len(next(gen).tokens)
        assert ahead.in_flight == (emitted < max_new)
    assert emitted == max_new
    gen.close()


@pytest.mark.parametrize("name", ["none", "lookup"])
def test_nothing_is_launched_after_an_end_of_generation_token(name):
    target, _ = _greedy_setup()
    plain, _, _ = generate(target, make_drafter("none"), PROMPT, GREEDY, 4, 40)
    j = next(i for i in range(3, 40) if plain[i] not in plain[:i])  # its first occurrence
    ahead = AheadLM(target.table, n_ctx=target.n_ctx, eog=[plain[j]])
    prefill(ahead, PROMPT)
    gen = rounds(ahead, make_drafter(name), PROMPT, GREEDY, make_rng(0), 4, Stats())
    out = []
    while plain[j] not in out:
        out += next(gen).tokens
        assert ahead.in_flight == (plain[j] not in out)
    assert out[: j + 1] == plain[: j + 1]
    gen.close()
    assert ahead.events[-1] == ("finish",)  # the last round's call, read: nothing since


def test_a_drafter_failing_while_the_next_round_is_planned_fails_after_this_round_is_delivered():
    class Failing:
        name = "failing"
        calls = 0

        def propose(self, context, k, params, rng):
            self.calls += 1
            if self.calls == 3:
                raise RuntimeError("boom")
            return Draft(source="none")

    for target in (_greedy_setup()[0], _ahead(_greedy_setup()[0])):
        prefill(target, PROMPT)
        gen = rounds(target, Failing(), PROMPT, GREEDY, make_rng(0), 4, Stats())
        assert len(next(gen).tokens) == len(next(gen).tokens) == 1  # rounds 1 and 2 delivered
        with pytest.raises(RuntimeError, match="boom"):
            next(gen)


def test_the_callers_time_between_rounds_is_not_the_targets():
    # the fake's calls cost microseconds; the caller spends 10 ms on each of 5 rounds
    target, _ = _greedy_setup()
    ahead = _ahead(target)
    prefill(ahead, PROMPT)
    stats = Stats()
    gen = rounds(ahead, make_drafter("lookup"), PROMPT, GREEDY, make_rng(0), 4, stats)
    for _ in range(5):
        next(gen)
        time.sleep(0.010)
    gen.close()
    assert stats.time_target + stats.time_drafting + stats.time_sampling < 0.020


def _gpu_auto(draft, draft_cost=1.2e-3):
    """``auto`` on a GPU-like policy (a flat curve; a call of a new width 2 ms more, the second
    of a width 1 ms more) whose costs and guard do not move with the fakes' microsecond calls:
    its choices then depend on the text alone."""
    from edgespec.core.costs import CallCosts, CostCurve
    from edgespec.core.policy import CostEstimate, Policy

    costs = CallCosts(CostCurve({1: 2.0e-3, 4: 2.6e-3, 16: 3.4e-3, 33: 5.0e-3}),
                      changed=2.0e-3, second=1.0e-3, graphs=True)
    policy = Policy(costs, CostEstimate(draft_cost) if draft is not None else None)
    auto = make_drafter("auto", draft, 8, policy=policy)
    costs.observe = lambda width, last, run, seconds: None
    policy.lookup_cost.observe = lambda s: None
    if policy.draft_cost is not None:
        policy.draft_cost.observe = lambda s: None
    policy.realized.record = lambda source, tokens, seconds: None
    return auto


@pytest.mark.parametrize("with_model", [False, True], ids=["lookup-only", "draft-model"])
def test_auto_launches_an_assured_plain_step_before_its_own_work_and_plays_the_same_rounds(
        with_model):
    """On an asynchronous target, a plain step that auto assured (``plain_next``) is launched
    as soon as the last round is committed, before auto observes that round and proposes (the
    work runs while the device computes); auto's proposal then, made all the same, is plain.
    The rounds are those of the same auto launching each round after its work, and the text
    is greedy plain decoding's."""
    def setup():  # (a text that copies itself in stretches, with free text between)
        return pair(8, seed=2, draft="perturbed", markov=2.5, context=0.3)

    target, draft = setup()
    plain, _, _ = generate(target, make_drafter("none"), PROMPT, GREEDY, 4, 160)
    # (a draft model that costs 3 ms a token: on this curve it never pays, so plain steps
    # can be assured with it at hand)
    target, draft = setup()
    want, want_rounds, _ = generate(target, _gpu_auto(draft if with_model else None, 3e-3),
                                    PROMPT, GREEDY, 8, 160)
    target, draft = setup()
    ahead = _ahead(target)
    auto = _gpu_auto(draft if with_model else None, 3e-3)
    observe, propose = auto.observe, auto.propose

    def logged_observe(outcome):
        ahead.events.append(("observe",))
        observe(outcome)

    def logged_propose(context, k, params, rng):
        got = propose(context, k, params, rng)
        ahead.events.append(("propose", len(got.tokens)))
        return got

    auto.observe, auto.propose = logged_observe, logged_propose
    got, got_rounds, _ = generate(ahead, auto, PROMPT, GREEDY, 8, 160)
    assert got == want == plain and got_rounds == want_rounds
    assert any(r.drafted for r in got_rounds) and any(not r.drafted for r in got_rounds)
    ev = ahead.events
    first = [i for i in range(1, len(ev) - 2)
             if ev[i - 1] == ("finish",) and ev[i] == ("start", 1) and ev[i + 1] == ("observe",)]
    assert len(first) >= 10
    assert all(ev[i + 2] == ("propose", 0) for i in first)
    # elsewhere the work comes first: observe, propose, then the launch
    assert all(ev[i + 1][0] in ("observe", "propose") for i in range(len(ev) - 1)
               if ev[i] == ("finish",) and i + 1 not in first)
