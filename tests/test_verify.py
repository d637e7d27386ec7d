"""``edgespec verify``: the two-sample statistics (pure), the command's input checks, and the audit
on real models: it passes on the real engine and fails on a deliberately broken sampler."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from click.testing import CliRunner

from edgespec.bench.verify import tv_distance, tv_test, verify_greedy, verify_sampling
from edgespec.cli.main import cli
from edgespec.core import rejection
from edgespec.core.dist import as_dist
from edgespec.core.rejection import Source, Verdict
from edgespec.core.sampling import SamplingParams
from edgespec.runtime import loop


def _sample(p: list[float], n: int, rng: np.random.Generator) -> Counter:
    return Counter(rng.choice(len(p), size=n, p=p).tolist())


def test_tv_distance_of_empirical_distributions():
    assert tv_distance(Counter("aab"), Counter("aab")) == 0.0
    assert tv_distance(Counter("aa"), Counter("bb")) == 1.0
    assert tv_distance(Counter("aabb"), Counter("a")) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        tv_distance(Counter(), Counter("a"))


def test_identical_samples_pass_and_disjoint_ones_fail():
    same = tv_test(Counter({"x": 30, "y": 20}), Counter({"x": 30, "y": 20}), permutations=200)
    assert same.tv == 0.0 and same.p_value == 1.0 and same.passed
    apart = tv_test(Counter({"x": 50}), Counter({"y": 50}), permutations=200)
    assert apart.tv == 1.0 and apart.p_value == pytest.approx(1 / 201) and not apart.passed
    assert apart.tv_upper >= apart.tv - 1e-12 and apart.critical < 0.5


def test_the_permutation_test_holds_its_level_and_has_power():
    # 300 pairs of samples (n = 150 each) of one 6-outcome distribution with a sparse tail: the
    # share of p <= alpha is Binomial(300, alpha') with alpha' <= alpha (the test is exact). With
    # alpha = 0.05 its sd is sqrt(.05 * .95 / 300) = 0.0126: allow alpha + 3 sd = 0.088.
    rng = np.random.default_rng(7)
    p = [0.4, 0.3, 0.2, 0.07, 0.02, 0.01]
    rejections = sum(
        not tv_test(_sample(p, 150, rng), _sample(p, 150, rng), alpha=0.05, permutations=199,
                    seed=i).passed
        for i in range(300)
    )
    assert rejections / 300 <= 0.05 + 3 * 0.0126
    # Power: a shift of 0.15 of mass (TV 0.15) is found in 39 of 50 trials at this size with
    # these seeds (power ~0.78, sd of the count sqrt(50 * .78 * .22) = 2.9): require 3 sd less.
    q = [0.55, 0.15, 0.2, 0.07, 0.02, 0.01]
    found = sum(not tv_test(_sample(p, 150, rng), _sample(q, 150, rng), alpha=0.05,
                            permutations=199, seed=i).passed for i in range(50))
    assert found >= 30


def test_rare_outcomes_are_pooled():
    a = Counter({"x": 50, "r1": 1, "r2": 1})
    b = Counter({"x": 50, "r3": 1, "r4": 1})
    assert tv_test(a, b, permutations=50).tv == 0.0  # the four rare outcomes are one "other"
    assert tv_test(a, b, permutations=50, min_count=1).tv == pytest.approx(2 / 52)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--drafters", "magic"], "--drafters: unknown magic"),
        (["--drafters", "none"], "--drafters: unknown none"),
        (["--no-greedy", "--temperature", "0"], "nothing to audit"),
        (["--temperature", "nan"], "temperature"),
        (["--samples", "5"], "--samples"),
        (["--prompt", "  "], "--prompt must not be empty"),
        (["--only", "no-such-prompt"], "no-such-prompt"),
    ],
)
def test_bad_options_are_refused_before_loading(args, message, monkeypatch):
    def no_loading(*a, **k):
        raise AssertionError("models loaded before the options were checked")

    monkeypatch.setattr("edgespec.cli.options.load_engine", no_loading)
    res = CliRunner().invoke(cli, ["verify", *args])
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert "Traceback" not in res.output


# ---- real models ------------------------------------------------------------------------------

def _accept_everything(draft_tokens, q_draft, p_target, rng):
    """A broken verifier that keeps every draft unchecked (plain steps stay right): what the
    audit must catch."""
    k = len(draft_tokens)
    if k == 0:
        return rejection.verify(draft_tokens, q_draft, p_target, rng)
    return Verdict(k, as_dist(p_target[k]).sample(rng), Source.BONUS)


def _accept_every_pick(draft_tokens, target_picks):
    """The same break in greedy rounds (judged from the target's picks)."""
    k = len(draft_tokens)
    if k == 0:
        return rejection.verify_greedy(draft_tokens, target_picks)
    return Verdict(k, int(target_picks[k]), Source.BONUS)


@pytest.mark.real
def test_audit_passes_on_the_tiny_model_and_catches_a_broken_sampler(tiny_engine, monkeypatch):
    prompts = [("copy", "Repeat after me: one two three four five six", True)]
    greedy = verify_greedy(tiny_engine, prompts, ["lookup", "model"], 24)
    assert all(r.passed and r.equal for r in greedy)
    params = SamplingParams(temperature=0.8)
    ok = verify_sampling(tiny_engine, "The cat sat on the mat. The cat sat on the", ["lookup"],
                         params, tokens=2, samples=60, alpha=0.001, permutations=999, chat=False)
    assert ok[0].passed and ok[0].drafted > 0

    monkeypatch.setattr(loop, "verify", _accept_everything)
    monkeypatch.setattr(loop, "verify_greedy", _accept_every_pick)
    bad = verify_sampling(tiny_engine, "The cat sat on the mat. The cat sat on the", ["lookup"],
                          params, tokens=2, samples=60, alpha=0.001, permutations=999, chat=False)
    assert not bad[0].passed and bad[0].test.p_value <= 0.001
    broken = verify_greedy(tiny_engine, [("words", "List ten random words.", True)], ["lookup"],
                           48)
    # Lookup's copies are kept unchecked (measured: the first difference at token 7): the greedy
    # audit finds it and does not excuse it as a near-tie (the kernels are exact).
    assert broken[0].drafted > 0 and not broken[0].equal and not broken[0].passed
    assert broken[0].divergence is not None and broken[0].gap is not None
    assert not broken[0].near_tie


@pytest.mark.real
@pytest.mark.slow
def test_verify_command_on_the_default_pair():
    # CI-sized: one edit prompt x 32 tokens (greedy) and 100 seeded runs of 3 tokens per drafter
    # at T = 0.8. Seeds are fixed, but auto's choices follow the machine's timings, so its check
    # is a fresh draw each run: alpha = 0.001 per check keeps a false alarm below 0.5% a run.
    res = CliRunner().invoke(cli, [
        "verify", "--only", "edit-type-hints", "--greedy-tokens", "32", "--samples", "100",
        "--tokens", "3", "--alpha", "0.001", "--json",
    ])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["passed"]
    assert {r["drafter"] for r in out["greedy"]} == {"auto", "lookup", "model", "hybrid"}
    assert all(r["equal"] for r in out["greedy"])
    assert {r["drafter"] for r in out["sampling"]} == {"auto", "lookup", "model", "hybrid"}
    for r in out["sampling"]:
        assert r["passed"] and r["alpha"] == 0.001 and r["samples"] == 100
        assert 0 <= r["tv"] <= r["tv_upper"] + 1e-9
    # Fixed drafters really drafted (and had drafts rejected) in the sampling audit.
    fixed = [r for r in out["sampling"] if r["drafter"] != "auto"]
    assert all(0 < r["accepted"] < r["drafted"] for r in fixed)


# ---- kernel modes: what a divergence may be excused by ----------------------------------------

class _WidthNoisy:
    """Wraps a fake target so that rows scored in a call of 2+ tokens move by ``shift`` on
    token 0's logit: batch-dependent kernels in miniature."""

    kernels = "batch-dependent"

    def __init__(self, lm, shift: float) -> None:
        self.lm, self.shift = lm, shift

    def __getattr__(self, name):
        return getattr(self.lm, name)

    def decode(self, tokens, n_logits):
        out = self.lm.decode(tokens, n_logits).copy()
        if len(tokens) > 1:
            out[:, 0] += self.shift
        return out


def test_batch_noise_measures_how_far_a_batch_moves_a_logit():
    from edgespec.bench.verify import batch_noise

    from .fakes import FakeLM, Table

    exact = FakeLM(Table(16, seed=3), n_ctx=64)
    assert batch_noise(exact, [1, 2, 3], [4, 5, 6, 7, 8]) == 0.0
    noisy = _WidthNoisy(FakeLM(Table(16, seed=3), n_ctx=64), 0.25)
    assert batch_noise(noisy, [1, 2, 3], [4, 5, 6, 7, 8]) == pytest.approx(0.25)
    assert batch_noise(noisy, [1, 2, 3], [4]) == 0.0  # one token: no batch to compare


def test_only_the_batch_dependent_mode_measures_a_tolerance():
    from edgespec.runtime.engine import Engine

    from .fakes import pair

    for shift, mode in ((0.0, "exact-pieces"), (0.125, "batch-dependent")):
        target, draft = pair(16, seed=2)
        target = _WidthNoisy(target, shift)
        target.kernels = mode
        engine = Engine(target, draft, drafter="model", draft_length=3)
        res = verify_greedy(engine, [("p", "abcabc", False)], ["model"], 12)
        assert res[0].tolerance == (None if shift == 0 else pytest.approx(2 * shift))


def _report(mode: str, results) -> str:
    from edgespec.cli.verify import format_report

    header = {"target": "t.gguf", "draft": "d.gguf", "kernels": f"<{mode}>", "kernel_mode": mode}
    return format_report(header, results, [], 32)


def test_the_report_says_where_the_draft_window_is_taken():
    from edgespec.cli.verify import format_report

    header = {"target": "t.gguf", "draft": "d.gguf", "kernels": "k", "kernel_mode": "k"}
    assert "draft window" not in format_report(dict(header, draft_window=0,
                                                    draft_window_mode="off"), [], [], 32)
    text = format_report(dict(header, draft_window=64, draft_window_mode="device"), [], [], 32)
    assert "draft window: 64 tokens (device)" in text


def test_the_report_names_the_mode_and_excuses_only_measured_near_ties():
    from edgespec.bench.verify import GreedyResult

    exact = GreedyResult("p", "lookup", 32, False, divergence=5, gap=0.01)
    text = _report("exact-fixed-width", [exact])
    assert "kernels: <exact-fixed-width>" in text and "any difference is a bug" in text
    assert "gap 0.010: a bug (exact kernels)" in text and "verdict: FAIL" in text

    flip = GreedyResult("p", "lookup", 32, False, divergence=5, gap=0.3, tolerance=0.5,
                        near_tie=True)
    far = GreedyResult("q", "lookup", 32, False, divergence=9, gap=0.7, tolerance=0.5)
    text = _report("batch-dependent", [flip, far])
    assert "moved a logit by up to 0.2500 on this device" in text
    assert "at most 0.5000 (twice that)" in text
    assert "gap 0.300: near-tie flip (within the measured batch-shape noise)" in text
    assert "gap 0.700: above 0.5000, outside the measured noise: a bug" in text
    assert "verdict: FAIL" in text
