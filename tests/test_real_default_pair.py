"""Real llama.cpp on the default pair: Qwen2.5-Coder-1.5B-Instruct target, 0.5B draft (Q4_K_M).

The central promise: greedy speculative output is the greedy target-only output, token for
token. edgespec's llama.cpp build and settings make the target's logits independent of batch
shape (README, "Exactness"), so equality is required outright; the fast-kernel test shows what
happens without that, and that a divergence then only ever occurs at a measured near-tie.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from edgespec.core.costs import CallCosts, CostCurve
from edgespec.core.policy import CostEstimate
from edgespec.core.sampling import SamplingParams, process
from edgespec.errors import IncompatibleDraftError
from edgespec.runtime.backend import consistent_build
from edgespec.runtime.engine import Costs, Engine

from .real_util import GREEDY, batch_noise, first_divergence, ids, top2_gap
from .stats_util import ALPHA, chi2_pvalue

pytestmark = [pytest.mark.real, pytest.mark.slow]

CODE = '''def load_users(path):
    users = []
    with open(path) as fh:
        for line in fh:
            name, age, email = line.strip().split(",")
            users.append({"name": name, "age": int(age), "email": email})
    return users


def adults(users):
    return [u for u in users if u["age"] >= 18]


def emails_by_domain(users):
    out = {}
    for u in users:
        domain = u["email"].split("@")[1]
        out.setdefault(domain, []).append(u["email"])
    return out


def oldest(users):
    best = None
    for u in users:
        if best is None or u["age"] > best["age"]:
            best = u
    return best


def save_users(users, path):
    with open(path, "w") as fh:
        for u in users:
            fh.write(f"{u['name']},{u['age']},{u['email']}\\n")
'''

PROMPTS = {
    # copy-heavy code edit: most of the answer is in the prompt
    "edit": "Add type hints to every function in this Python code. Reply with the full code only."
            "\n\n" + CODE,
    # free code generation (asked for enough that any CPU's greedy answer runs past 256 tokens)
    "free": "Write a Python function that reverses a linked list, then explain it step by step "
            "and give unit tests.",
    # plain prose
    "prose": "Explain in detail how a hash map works, with an example.",
}
N_TOKENS = 256
SPEC_DRAFTERS = ("model", "lookup", "hybrid", "auto")

_runs: dict[tuple[str, str], object] = {}


#: Costs under which drafting pays (a GPU's flat t(n), a cheap draft model), frozen for auto's
#: runs: what auto does then depends on the text alone, not on this machine's load, so the
#: equality tests below always see it mix lookup, the draft model and plain steps.
FLAT_COSTS = ({1: 0.030, 4: 0.032, 16: 0.036, 32: 0.040}, 0.003)


def run(engine, prompt: str, drafter: str):
    """Greedy 256-token completion, memoised: several tests look at the same runs."""
    key = (prompt, drafter)
    if key not in _runs:
        with pytest.MonkeyPatch.context() as mp:
            if drafter == "auto":
                curve, per_token = FLAT_COSTS
                mp.setattr(engine, "costs", Costs(CallCosts(CostCurve(dict(curve))), per_token, 0.0))
                mp.setattr(CallCosts, "observe", lambda self, *call: None)
                mp.setattr(CostEstimate, "observe", lambda self, s: None)
            _runs[key] = engine.complete(PROMPTS[prompt], max_tokens=N_TOKENS, drafter=drafter,
                                         sampling=GREEDY)
    return _runs[key]


def test_build_is_batch_consistent(default_engine):
    # Everything below relies on it; `make setup` builds llama.cpp without llamafile's sgemm.
    assert consistent_build()
    # Only the target needs batch-independent logits; the draft keeps the fast kernels.
    assert default_engine.target.options.batch_consistent
    assert not default_engine.draft.options.batch_consistent


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("drafter", SPEC_DRAFTERS)
def test_greedy_speculative_equals_target_only(default_engine, prompt, drafter):
    plain = run(default_engine, prompt, "none")
    spec = run(default_engine, prompt, drafter)
    assert plain.stats.generated == N_TOKENS, "prompt must yield at least 256 tokens"
    assert spec.stats.drafted > 0
    if drafter == "auto":  # it mixed its sources
        assert set(spec.stats.by_drafter) >= {"model"} | ({"lookup"} if prompt == "edit" else set())
    assert ids(spec) == ids(plain), f"diverged at token {first_divergence(ids(spec), ids(plain))}"
    assert spec.text == plain.text


def test_model_drafter_mostly_accepted_and_rejections_happen(default_engine):
    spec = run(default_engine, "free", "model")
    # The test above is only meaningful if verification both accepted and rejected drafts.
    assert 0.3 < spec.stats.acceptance_rate < 1.0
    assert spec.stats.accepted_hist[0] > 0 and spec.stats.accepted_hist[-1] > 0


def test_lookup_accepts_most_tokens_on_copy_heavy_edit(default_engine):
    spec = run(default_engine, "edit", "lookup")
    # measured 0.76 acceptance and ~2.5 tokens per target call on this prompt
    assert spec.stats.acceptance_rate > 0.5
    assert spec.stats.tokens_per_round > 1.8


def test_target_as_its_own_draft_accepts_everything(default_engine):
    with Engine.load(default_engine.target.path, default_engine.target.path, drafter="model",
                     draft_length=4, n_ctx=1024, progress=False) as engine:
        out = engine.complete(PROMPTS["free"], max_tokens=64, sampling=GREEDY)
    assert out.stats.drafted > 0 and out.stats.accepted == out.stats.drafted
    assert out.tokens[:5] and all(t.source.value in ("draft", "bonus") for t in out.tokens)


def test_fast_kernels_diverge_only_at_near_ties(default_engine):
    """Without batch consistency a near-tie may flip; any divergence must sit at a near-tie."""
    with Engine.load(pair="default", drafter="hybrid", n_ctx=1024, batch_consistent=False,
                     progress=False) as fast:
        plain = fast.complete(PROMPTS["prose"], max_tokens=N_TOKENS, drafter="none", sampling=GREEDY)
        spec = fast.complete(PROMPTS["prose"], max_tokens=N_TOKENS, drafter="hybrid", sampling=GREEDY)
        i = first_divergence(ids(spec), ids(plain))
        prompt = fast.prompt_tokens(PROMPTS["prose"])
        # what verify measures: each logit may move by the noise, so a gap of twice it may flip
        noise = batch_noise(fast.target, prompt, ids(plain)[:16])
        assert noise > 0  # (measured 0.3-0.5: these kernels really are batch-dependent)
        if i is not None:
            gap = top2_gap(fast, prompt + ids(plain)[:i])
            assert gap <= 2 * noise, f"divergence at token {i} with top-2 gap {gap:.3f}"


def test_incompatible_draft_is_refused_before_generating():
    from edgespec.models.resolve import resolve_model

    tiny = resolve_model("smollm2-135m-instruct-q4_1", progress=False)
    with pytest.raises(IncompatibleDraftError, match="vocabulary sizes differ|tokenizer types"):
        Engine.load(pair="default", draft=str(tiny), drafter="model", n_ctx=256, progress=False)


FRUIT = "Name one random fruit. Reply with a single word."


def test_sampled_first_tokens_follow_the_target_distribution(default_engine):
    """Temperature 1, model drafter: the first two generated tokens, over 500 seeded runs,
    against the exact target distribution computed from the target's own logits.

    500 runs of a distribution whose main outcomes have probability 0.35, 0.27, 0.05...: the
    chi-square test (outcomes with expected count < 5 pooled) has ample power against the
    drafter's distribution (the draft model prefers other fruits), and ALPHA bounds the chance
    that a correct sampler fails. The draft-dependent paths (accept, residual, bonus) are all hit.
    """
    engine = default_engine
    params = SamplingParams(temperature=1.0)
    n_runs = 500
    seeds = np.random.default_rng(2024).integers(0, 2**31, size=n_runs)
    outcomes: Counter = Counter()
    sources: Counter = Counter()
    for seed in seeds:
        out = engine.complete(FRUIT, max_tokens=2, drafter="model", draft_length=2,
                              sampling=SamplingParams(temperature=1.0, seed=int(seed)))
        toks = tuple(t.id for t in out.tokens) + (("<eog>",) if out.finish_reason == "stop" else ())
        outcomes[toks[:2]] += 1
        sources.update(t.source.value for t in out.tokens)
    assert sources["draft"] and sources["corrected"] and sources["bonus"]

    expected, enumerated = exact_first_two(engine, FRUIT, params, min_prob=0.5 / n_runs)
    # first tokens too rare to enumerate are pooled into one outcome, observed and expected alike
    pooled: Counter = Counter()
    for toks, n in outcomes.items():
        pooled[toks if toks[0] in enumerated or toks == ("<eog>",) else ("rest",)] += n
    assert chi2_pvalue(pooled, expected) > ALPHA


def exact_first_two(engine, prompt: str, params: SamplingParams, min_prob: float):
    """P(x1, x2) from the target alone for every x1 above min_prob, the rest pooled as
    ``("rest",)``; an end-of-generation first token is ``("<eog>",)``. Returns the distribution
    and the set of enumerated first tokens."""
    target = engine.target
    ctx = engine.prompt_tokens(prompt)
    target.sync(ctx[:-1])
    p1 = process(target.decode(ctx[-1:], 1)[0], params)
    expected: dict = {("<eog>",): 0.0}
    enumerated = set()
    rest = 0.0
    for x1 in np.flatnonzero(p1):
        x1 = int(x1)
        if target.is_eog(x1):
            expected[("<eog>",)] += p1[x1]
            continue
        if p1[x1] < min_prob:
            rest += p1[x1]
            continue
        enumerated.add(x1)
        target.sync(ctx)
        p2 = process(target.decode([x1], 1)[0], params)
        for x2 in np.flatnonzero(p2):
            key = (x1, "<eog>") if target.is_eog(int(x2)) else (x1, int(x2))
            expected[key] = expected.get(key, 0.0) + p1[x1] * p2[x2]
    expected[("rest",)] = rest
    return expected, enumerated
