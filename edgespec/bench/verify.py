"""``edgespec verify``: an exactness audit on the user's own models and settings.

Two checks, each per drafter:

- **greedy**: speculative and target-only greedy outputs are equal, token for token, over a
  prompt set. In an exact kernel mode (CPU pieces, or a fixed width) anything else is a bug.
  In the batch-dependent mode (GPU offload without a fixed width, ``--fast-kernels``) the
  target's logits move with the batch width, by an amount :func:`batch_noise` measures on this
  device at the start of the audit; a divergence is reported with the target's top-2 logit gap
  at that point, and excused as a near-tie flip only if that gap is within twice the noise
  (each of the two logits may move by the noise), else it is a bug.
- **sampling**: the joint distribution of the first ``n`` generated tokens, speculative versus
  target-only, each from ``samples`` independently seeded runs. The statistic is the total
  variation distance (TV) between the two empirical distributions. Even for two samples of one
  distribution it is above zero, so the pass/fail is a permutation test (exact under the null
  hypothesis "same distribution": pool both samples, relabel at random, recompute the TV), at a
  stated significance level. A bootstrap gives an upper confidence bound on the TV.

Both checks take the generation's shaping as it will be used: penalties and logit bias (the
sampling settings, greedy at temperature 0), and a constraint (a JSON schema, JSON object mode
or a grammar: :class:`~edgespec.runtime.constraint.Constraint`), given alike to the
speculative runs and to the target-only ones they are compared with (drafter ``none``: plain
constrained decoding, where no token is forced ahead or drafted).

The statistics are pure functions of outcome counts; :func:`verify_greedy` and
:func:`verify_sampling` drive an :class:`edgespec.runtime.engine.Engine`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Iterable, Sequence

import numpy as np

from ..core.penalties import shape, window
from ..core.sampling import SamplingParams
from ..runtime.kernels import BATCH_DEPENDENT, mode_of
from ..runtime.loop import prefill

#: Batch widths :func:`batch_noise` compares with one token per call.
NOISE_WIDTHS = (2, 3, 4, 8, 16)

DEFAULT_ALPHA = 0.01
DEFAULT_SAMPLES = 300
DEFAULT_SAMPLE_TOKENS = 3
DEFAULT_GREEDY_TOKENS = 128
DEFAULT_PERMUTATIONS = 2000
#: Raw text (no chat template), so that every drafter has something to propose from the first
#: token on (prompt lookup copies " mat. The dog ..."), and the target is unsure enough of the
#: continuation at 0.8 that drafts are often rejected: the residual distribution is exercised.
DEFAULT_SAMPLING_PROMPT = "The cat sat on the mat. The dog sat on the rug. The cat sat on the"
#: Outcomes seen fewer times than this in both samples together are pooled into one "other"
#: outcome before testing (the pooling depends only on the pooled counts, which relabelling does
#: not change, so the permutation test stays exact; it gains power against sparse tails).
MIN_OUTCOME_COUNT = 5
#: Seeds of speculative runs start here (target-only runs use 0..samples-1): disjoint seeds keep
#: the two samples independent.
SPEC_SEED_BASE = 1_000_000


# ---- statistics (pure) ------------------------------------------------------------------------

def tv_distance(a: Counter, b: Counter) -> float:
    """Total variation distance between the empirical distributions of two outcome counts."""
    if not a or not b:
        raise ValueError("both samples need at least one outcome")
    return _tv_codes(*_codes(a, b))


def _codes(a: Counter, b: Counter, min_count: int = 1) -> tuple[np.ndarray, np.ndarray, int]:
    pooled = a + b
    frequent = sorted((x for x in pooled if pooled[x] >= min_count), key=repr)
    keys = {x: i for i, x in enumerate(frequent)}
    other = len(keys)
    keys.update({x: other for x in pooled if x not in keys})
    xa = np.repeat([keys[x] for x in a], [a[x] for x in a]).astype(np.int64)
    xb = np.repeat([keys[x] for x in b], [b[x] for x in b]).astype(np.int64)
    return xa, xb, other + 1


def _tv_codes(xa: np.ndarray, xb: np.ndarray, k: int) -> float:
    pa = np.bincount(xa, minlength=k) / len(xa)
    pb = np.bincount(xb, minlength=k) / len(xb)
    return 0.5 * float(np.abs(pa - pb).sum())


@dataclass(frozen=True)
class TVTest:
    """The two-sample TV test of one drafter against target-only sampling."""

    tv: float  #: observed TV between the two empirical distributions
    tv_upper: float  #: bootstrap upper confidence bound on the TV (at 1 - alpha)
    critical: float  #: TV that equal distributions exceed with probability alpha at these sizes
    p_value: float  #: permutation p-value of "same distribution"
    alpha: float

    @property
    def passed(self) -> bool:
        return self.p_value > self.alpha


def tv_test(a: Counter, b: Counter, *, alpha: float = DEFAULT_ALPHA,
            permutations: int = DEFAULT_PERMUTATIONS, seed: int = 0,
            min_count: int = MIN_OUTCOME_COUNT) -> TVTest:
    """Permutation test of "a and b are samples of one distribution", with the TV as statistic.

    The TV is taken over outcomes seen at least ``min_count`` times in a and b together, the
    rarer ones pooled as one (see MIN_OUTCOME_COUNT).

    p-value = (1 + #{permuted TV >= observed}) / (1 + permutations), which is exact (a valid
    p-value) for any sample size. ``critical`` is the (1 - alpha) quantile of the permuted TVs:
    the noise level of the statistic at these sample sizes. ``tv_upper`` is the (1 - alpha)
    bootstrap quantile of the TV (each sample resampled from itself); the plug-in TV is biased
    upwards, so this bound is conservative.
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    xa, xb, k = _codes(a, b, min_count)
    observed = _tv_codes(xa, xb, k)
    rng = np.random.default_rng(seed)
    pooled = np.concatenate([xa, xb])
    perm = np.empty(permutations)
    boot = np.empty(permutations)
    for i in range(permutations):
        shuffled = rng.permutation(pooled)
        perm[i] = _tv_codes(shuffled[: len(xa)], shuffled[len(xa):], k)
        boot[i] = _tv_codes(rng.choice(xa, len(xa)), rng.choice(xb, len(xb)), k)
    p_value = (1 + int(np.sum(perm >= observed - 1e-12))) / (1 + permutations)
    return TVTest(observed, float(np.quantile(boot, 1 - alpha)),
                  float(np.quantile(perm, 1 - alpha)), p_value, alpha)


# ---- audits on an engine ----------------------------------------------------------------------

@dataclass
class GreedyResult:
    """One prompt, one drafter: speculative greedy against target-only greedy."""

    prompt: str  #: prompt id
    drafter: str
    tokens: int  #: target-only tokens compared
    equal: bool
    divergence: int | None = None  #: index of the first differing token
    gap: float | None = None  #: target's top-2 logit gap there (plain decoding's view)
    #: batch-dependent kernels only: the gap is within ``tolerance``, a flip the noise explains
    near_tie: bool = False
    #: largest gap a batch-shape flip can have here: twice the measured noise (None when exact)
    tolerance: float | None = None
    drafted: int = 0  #: by the drafter (tokens a constraint forced are ``forced``)
    accepted: int = 0
    forced: int = 0  #: tokens a constraint forced, drafted ahead (always accepted)

    @property
    def passed(self) -> bool:
        return self.equal or self.near_tie


@dataclass
class SamplingResult:
    """One drafter: the first ``tokens`` tokens' distribution against target-only sampling."""

    drafter: str
    tokens: int
    samples: int
    test: TVTest
    outcomes: int  #: distinct token sequences seen (both samples)
    drafted: int = 0  #: by the drafter (tokens a constraint forced are ``forced``)
    accepted: int = 0
    forced: int = 0  #: tokens a constraint forced, drafted ahead (always accepted)
    top: list[tuple[str, int, int]] = field(default_factory=list)  #: (text, target, spec) counts

    @property
    def passed(self) -> bool:
        return self.test.passed


Progress = Callable[[str], None]


def _ids(completion) -> list[int]:
    return [t.id for t in completion.tokens]


def _drafts(stats) -> tuple[int, int, int]:
    """(drafted, accepted) by the drafter, and the tokens a constraint forced, of one run."""
    forced = stats.by_drafter.get("forced")
    n = forced.drafted if forced is not None else 0
    return stats.drafted - n, stats.accepted - n, n


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first token where ``a`` and ``b`` differ (the shorter length if one is a
    prefix of the other); None if they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def top2_gap(engine, context: Sequence[int], *, params: SamplingParams | None = None,
             constraint=None, prompt_length: int = 0) -> float:
    """The target's logit gap between its two best next tokens after ``context`` (one token
    scored alone, as plain decoding does), in the row that is sampled from: shaped by
    ``params``' penalties and bias, and with a ``constraint`` (the answer being
    ``context[prompt_length:]``) among the tokens it allows (inf where it allows one)."""
    target = engine.target
    target.sync(list(context[:-1]))
    logits = target.decode(list(context[-1:]), 1)[0]
    if params is not None and params.shaped:
        logits = shape(logits, params, window(list(context), params))
    if constraint is not None:
        from ..runtime.constraint import Matcher

        matcher = Matcher(constraint, target.constraint_tokenizer, target.n_vocab)
        matcher.push(list(context[prompt_length:]))
        logits = matcher.apply(logits)
    top = np.sort(logits)[-2:]
    return float(top[1] - top[0]) if top[1] > -np.inf else float("nan")


def batch_noise_by_width(model, context: Sequence[int], continuation: Sequence[int],
                         widths: Sequence[int] = NOISE_WIDTHS) -> dict[int, float]:
    """For each k in ``widths`` (2 up to the continuation's length): the largest |logit
    difference| between scoring ``continuation[:k]`` one token per call (as plain decoding
    does) and in one call of k tokens (as verification does), after ``context``. 0.0 in an
    exact kernel mode. Leaves the cache holding ``context`` and part of ``continuation``."""
    continuation = list(continuation)
    ks = [k for k in widths if 2 <= k <= len(continuation)]
    if not ks:
        return {}
    ahead = [*context, continuation[0]]  # prefill() caches all but the last: the context
    prefill(model, ahead)
    # (each decode's rows are valid until the next decode: copy)
    single = np.concatenate([model.decode([t], 1).copy() for t in continuation[:max(ks)]])
    worst = {}
    for k in ks:
        prefill(model, ahead)
        worst[k] = float(np.abs(model.decode(continuation[:k], k) - single[:k]).max())
    return worst


def batch_noise(model, context: Sequence[int], continuation: Sequence[int],
                widths: Sequence[int] = NOISE_WIDTHS) -> float:
    """The batch-shape noise of the model's kernels on this device: the largest
    :func:`batch_noise_by_width` (0.0 when there is no batch to compare)."""
    return max(batch_noise_by_width(model, context, continuation, widths).values(), default=0.0)


def verify_greedy(engine, prompts: Iterable[tuple[str, object, bool]], drafters: Sequence[str],
                  max_tokens: int = DEFAULT_GREEDY_TOKENS, *,
                  progress: Progress | None = None, params: SamplingParams | None = None,
                  constraint=None) -> list[GreedyResult]:
    """Greedy-decode each ``(id, prompt, chat)`` target-only, then with each drafter, and compare
    the tokens. ``prompt`` is what :meth:`Engine.stream` takes; ``chat`` applies the template.
    ``params``: penalties and logit bias to decode with (at temperature 0; default none);
    ``constraint``: what both runs must match. With batch-dependent kernels, the noise that
    excuses a near-tie flip is measured on the first prompt's text (:func:`batch_noise`) and
    reported as each result's ``tolerance``."""
    greedy = (SamplingParams(temperature=0.0) if params is None
              else replace(params, temperature=0.0, seed=None))
    shaping = dict(constraint=constraint) if constraint is not None else {}
    dependent = mode_of(engine.target) == BATCH_DEPENDENT
    tolerance = None
    results = []
    for pid, prompt, chat in prompts:
        if progress:
            progress(f"greedy {pid}: none")
        plain = engine.complete(prompt, max_tokens=max_tokens, drafter="none", sampling=greedy,
                                chat=chat, **shaping)
        want = _ids(plain)
        prompt_ids = engine.prompt_tokens(prompt, chat=chat)
        if dependent and tolerance is None and len(want) >= 2:
            if progress:
                progress("measuring the kernels' batch-shape noise")
            tolerance = 2 * batch_noise(engine.target, prompt_ids, want)
        for name in drafters:
            if progress:
                progress(f"greedy {pid}: {name}")
            spec = engine.complete(prompt, max_tokens=max_tokens, drafter=name, sampling=greedy,
                                   chat=chat, **shaping)
            got = _ids(spec)
            i = first_divergence(got, want)
            res = GreedyResult(pid, name, len(want), i is None, divergence=i,
                               **dict(zip(("drafted", "accepted", "forced"), _drafts(spec.stats))))
            results.append(res)
            if i is not None:
                res.gap = top2_gap(engine, prompt_ids + want[:i], params=greedy,
                                   constraint=constraint, prompt_length=len(prompt_ids))
    for res in results:  # (the noise may have been measured after a divergence)
        res.tolerance = tolerance
        res.near_tie = res.gap is not None and tolerance is not None and res.gap <= tolerance
    return results


def _text(engine, ids: Sequence[int]) -> str:
    return b"".join(engine.target.token_bytes(t) for t in ids).decode("utf-8", "replace")


def _first_tokens(engine, prompt, drafter: str, params: SamplingParams, n: int, seeds: Iterable[int],
                  chat: bool, constraint=None) -> tuple[Counter, int, int, int]:
    counts: Counter = Counter()
    drafted = accepted = forced = 0
    shaping = dict(constraint=constraint) if constraint is not None else {}
    for seed in seeds:
        run = engine.complete(prompt, max_tokens=n, drafter=drafter, chat=chat,
                              sampling=replace(params, seed=seed), **shaping)
        counts[tuple(_ids(run))] += 1
        d, a, f = _drafts(run.stats)
        drafted, accepted, forced = drafted + d, accepted + a, forced + f
    return counts, drafted, accepted, forced


def verify_sampling(engine, prompt, drafters: Sequence[str], params: SamplingParams,
                    tokens: int = DEFAULT_SAMPLE_TOKENS, samples: int = DEFAULT_SAMPLES, *,
                    alpha: float = DEFAULT_ALPHA, permutations: int = DEFAULT_PERMUTATIONS,
                    chat: bool = True, progress: Progress | None = None,
                    constraint=None) -> list[SamplingResult]:
    """For each drafter, test the distribution of the first ``tokens`` tokens against
    target-only sampling (``samples`` seeded runs each; target-only seeds 0..samples-1), both
    under ``constraint`` if one is given."""
    if params.greedy:
        raise ValueError("the sampling audit needs a temperature > 0")
    if progress:
        progress(f"sampling: none x {samples}")
    base, _, _, _ = _first_tokens(engine, prompt, "none", params, tokens, range(samples), chat,
                                  constraint)
    results = []
    for i, name in enumerate(drafters):
        if progress:
            progress(f"sampling: {name} x {samples}")
        seeds = range(SPEC_SEED_BASE * (i + 1), SPEC_SEED_BASE * (i + 1) + samples)
        counts, drafted, accepted, forced = _first_tokens(engine, prompt, name, params, tokens,
                                                          seeds, chat, constraint)
        test = tv_test(base, counts, alpha=alpha, permutations=permutations, seed=i)
        top = [(_text(engine, seq), base[seq], counts[seq])
               for seq, _ in (base + counts).most_common(5)]
        results.append(SamplingResult(name, tokens, samples, test, len(set(base) | set(counts)),
                                      drafted, accepted, forced, top))
    return results


def to_dict(greedy: Sequence[GreedyResult], sampling: Sequence[SamplingResult]) -> dict:
    """Both audits as plain data (``edgespec verify --json``)."""
    return {
        "passed": all(r.passed for r in greedy) and all(r.passed for r in sampling),
        "greedy": [asdict(r) | {"passed": r.passed} for r in greedy],
        "sampling": [
            {k: v for k, v in asdict(r).items() if k != "test"}
            | asdict(r.test) | {"passed": r.passed}
            for r in sampling
        ],
    }
