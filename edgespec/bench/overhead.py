"""``edgespec bench --overhead``: edgespec's own host work per token, with the model taken away.

A synthetic model with the target's real vocabulary size answers every decode at once with
generated logit rows; the real loop, drafters, sampler and rejection test run on it. What is
left of the wall clock after the synthetic decodes is edgespec's work: the part of every token
that a GPU cannot hide (a GPU token of the default target costs ~2 ms).

The rows mimic a code model's: a bulk of N(0, 2) logits and a few planted peaks whose height
varies from row to row (confident rows and flat ones, so top-p nuclei are sometimes wide). The
row for a position depends on the two tokens before it, so greedy text falls into cycles that
prompt lookup can copy, and the draft's row is the target's plus noise, so the draft model is
usually but not always right.

Generated rows are flatter than a real model's (40% of them hold a wide top-p nucleus; the
default target's own rows at temperature 0.8 put a median 99.5% of their mass on one token).
``--recorded PATH`` runs the same bench on rows recorded from the real pair instead
(:func:`record_pools`): the target's and the draft's rows at the same positions of the
target's own text, so a draft is as right as the real draft model is.

On a GPU that holds the draft model's output layer, a sampled draft's window is taken in
llama.cpp's graph and its rows never reach the host (the backend's ``device_window``).
``--device-window`` measures that path: the synthetic draft hands out each row's window,
computed in advance like its greedy picks, so the host's work per draft token is the window's
distribution and the draw, not a pass over a 152k row.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..config import DRAFT_WINDOW
from ..core.costs import CallCosts, CostCurve
from ..core.lookup import common_prefix
from ..core import rowpass
from ..core.policy import CostEstimate, Policy
from ..core.sampling import SamplingParams, make_rng, top_window
from ..core.stats import Stats
from ..errors import ConfigError
from ..runtime import sources
from ..runtime.allocator import keep_freed_memory
from ..runtime.loop import prefill, rounds

#: The default target's vocabulary (Qwen2.5-Coder).
DEFAULT_VOCAB = 151_936
#: plain decoding first; not a source that needs a real target's own layers (``mtp``)
DRAFTERS = tuple(n for n in reversed(sources.NAMES) if not sources.spec(n).extra_context)
LENGTHS = (4, 16)
SAMPLINGS: dict[str, SamplingParams] = {
    "greedy": SamplingParams(temperature=0.0),
    "t0.8": SamplingParams(temperature=0.8),
    "t0.8-top_k40": SamplingParams(temperature=0.8, top_k=40),
    "t0.8-top_p0.95": SamplingParams(temperature=0.8, top_p=0.95),
    "t0.8-min_p0.05": SamplingParams(temperature=0.8, min_p=0.05),
}
#: A GPU-like cost curve (flat in n) for ``auto``: it then drafts, as it would on a GPU.
GPU_CURVE = {1: 0.0020, 4: 0.0021, 16: 0.0024, 32: 0.0028}
GPU_DRAFT_TOKEN = 0.0006

_N_ROWS = 97
_N_WORDS = 512


class SyntheticModel:
    """A llama.cpp stand-in: ``sync``/``decode`` over generated rows, at no model cost.

    ``decode_seconds`` is the time spent producing the rows (a copy out of the pool), which the
    benchmark subtracts like the real engine subtracts llama.cpp's time. Like the real backend,
    it hands out its rows in one output buffer that every decode reuses (valid until the next
    decode): a fresh array per decode would add the cost of first touching new memory to the
    reads that follow, which llama.cpp's buffer does not have. The rows are read-only views,
    as the backend's are (NumPy copies such an array before an ``argmax``). Greedy picks come from
    ``decode_argmax`` as the real backend's do (llama.cpp's backend sampling computes them in its
    graph): each pool row's arg-max is known in advance, so they cost the loop nothing either.
    """

    def __init__(self, pool: np.ndarray, n_ctx: int,
                 windows: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        self.pool = pool
        self.n_vocab = pool.shape[1]
        self.n_rows = pool.shape[0]
        self.n_ctx = n_ctx
        self.tokens: list[int] = []
        self.decode_seconds = 0.0
        self._out = np.empty((0, self.n_vocab), pool.dtype)
        self._picks = pool.argmax(axis=1).astype(np.int32)
        self._windows = windows
        #: windows given (:func:`device_windows`): drafts take them as from a GPU's top-k
        self.device_window = windows is not None

    def sync(self, prefix: Sequence[int]) -> int:
        return self.trim(common_prefix(self.tokens, prefix))

    def trim(self, n: int) -> int:
        del self.tokens[n:]
        return len(self.tokens)

    def _advance(self, tokens: Sequence[int], n_logits: int) -> list[int]:
        """Append ``tokens``; the pool rows of the last ``n_logits`` positions."""
        start = len(self.tokens)
        self.tokens.extend(tokens)
        ctx = self.tokens
        first = start + len(tokens) - n_logits
        return [row_index(ctx[i - 1] if i else 0, ctx[i], self.n_rows)
                for i in range(first, len(ctx))]

    def decode(self, tokens: Sequence[int], n_logits: int) -> np.ndarray:
        t0 = time.perf_counter()
        rows = self._advance(tokens, n_logits)
        if len(rows) > self._out.shape[0]:
            self._out = np.empty((len(rows), self.n_vocab), self.pool.dtype)
        out = self._out[: len(rows)]
        np.take(self.pool, rows, axis=0, out=out)
        self.decode_seconds += time.perf_counter() - t0
        view = out.view()
        view.flags.writeable = False  # as the real backend's (NumPy treats those differently)
        return view

    def decode_argmax(self, tokens: Sequence[int], n_logits: int) -> list[int]:
        t0 = time.perf_counter()
        ids = self._picks[self._advance(tokens, n_logits)].tolist()  # (a list, as the real one)
        self.decode_seconds += time.perf_counter() - t0
        return ids

    def decode_window(self, tokens: Sequence[int], n_logits: int,
                      window: int) -> tuple[np.ndarray, np.ndarray]:
        """Each row's window as the real backend's device gives it (``device_window`` only)."""
        t0 = time.perf_counter()
        if self._windows is None or self._windows[0].shape[1] != min(window, self.n_vocab):
            raise ValueError(f"no device windows of {window} for this synthetic model")
        rows = self._advance(tokens, n_logits)
        ids, logits = self._windows[0][rows], self._windows[1][rows]
        self.decode_seconds += time.perf_counter() - t0
        return ids, logits


def device_windows(pool: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Each pool row's ``window`` largest logits and their ids (int32 and float32, shape
    ``(rows, window)``, in no order), as llama.cpp's top-k in a GPU's graph hands a draft's
    window to the host (the real backend's ``decode_window``): computed once, so that they
    cost the loop nothing, as on the device."""
    return top_window(pool, min(window, pool.shape[1]))


def row_index(prev: int, token: int, n_rows: int = _N_ROWS) -> int:
    """Which of ``n_rows`` pool rows follows the tokens ``prev, token``."""
    return (prev * 31 + token * 17) % n_rows


def make_pools(n_vocab: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Target rows, draft rows (target plus noise) and the planted word ids."""
    rng = np.random.default_rng(seed)
    target = rng.normal(0.0, 2.0, (_N_ROWS, n_vocab)).astype(np.float32)
    words = rng.choice(n_vocab, _N_WORDS, replace=False)
    for r in range(_N_ROWS):
        top = rng.uniform(11.0, 18.0)  # confident rows and flat ones
        peaks = rng.choice(words, 6, replace=False)
        target[r, peaks] = top - np.array([0.0, 1.0, 1.8, 2.5, 3.0, 3.4], np.float32)
    draft = target + rng.normal(0.0, 0.6, target.shape).astype(np.float32)
    return target, draft, words


def record_pools(engine, prompts, n_rows: int = _N_ROWS,
                 temperature: float = 0.8) -> tuple[np.ndarray, np.ndarray]:
    """Target and draft rows of a loaded pair (``engine``: an :class:`edgespec.Engine` with a
    draft model), ``n_rows`` of each: on each prompt the target writes its own text at
    ``temperature`` (seeded), then both models score it, and each position gives a target
    row and the draft's row for the same next token."""
    from ..core.sampling import SamplingParams

    per = -(-n_rows // len(prompts))
    target_rows, draft_rows = [], []
    for i, prompt in enumerate(prompts):
        out = engine.complete(prompt.payload, max_tokens=per, drafter="none",
                              sampling=SamplingParams(temperature=temperature, seed=i))
        seq = engine.prompt_tokens(prompt.payload) + [t.id for t in out.tokens]
        n = len(out.tokens)
        for model, rows in ((engine.target, target_rows), (engine.draft, draft_rows)):
            model.reset()
            rows.append(np.array(model.decode(seq[:-1], n), np.float32))
    target = np.concatenate(target_rows)[:n_rows]
    draft = np.concatenate(draft_rows)[:n_rows]
    return target, draft


def save_pools(path, target: np.ndarray, draft: np.ndarray) -> None:
    """Write recorded rows (``.npz``, uncompressed: float32 logits hardly compress)."""
    with open(path, "wb") as f:
        np.savez(f, target=target, draft=draft)


def load_pools(path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Recorded rows (:func:`save_pools`) as :func:`make_pools` gives generated ones; the
    prompt's words are the target rows' likeliest tokens."""
    try:
        with np.load(path) as f:
            target, draft = f["target"], f["draft"]
    except (OSError, ValueError, KeyError) as err:
        raise ConfigError(f"{path} is not a file of recorded rows (target, draft): {err}") from None
    if (target.ndim != 2 or draft.ndim != 2 or target.shape[0] != draft.shape[0]
            or target.shape[0] < 2 or target.dtype != np.float32 or draft.dtype != np.float32):
        raise ConfigError(f"{path}: expected two float32 arrays of rows, one row of each per "
                          f"position; got {target.shape} {target.dtype} and {draft.shape} "
                          f"{draft.dtype}")
    words = np.unique(np.argsort(target, axis=1)[:, -4:])
    return target, draft, words


def make_prompt(words: np.ndarray, n: int = 256, seed: int = 1) -> list[int]:
    """A prompt whose second half repeats its first (something for lookup to find)."""
    rng = np.random.default_rng(seed)
    half = [int(t) for t in rng.choice(words, n // 2)]
    return half + half


@dataclass(frozen=True)
class OverheadResult:
    drafter: str
    k: int
    sampling: str
    tokens: int
    rounds: int
    host_seconds: float

    @property
    def us_per_token(self) -> float:
        return self.host_seconds / max(self.tokens, 1) * 1e6

    @property
    def us_per_round(self) -> float:
        return self.host_seconds / max(self.rounds, 1) * 1e6

    def to_dict(self) -> dict:
        return {"drafter": self.drafter, "k": self.k, "sampling": self.sampling,
                "us_per_token": round(self.us_per_token, 1),
                "us_per_round": round(self.us_per_round, 1),
                "tokens": self.tokens, "rounds": self.rounds}


def measure(drafter: str, k: int, label: str, pools, prompt: Sequence[int],
            n_tokens: int, seed: int = 0, draft_window: int = DRAFT_WINDOW,
            windows: tuple[np.ndarray, np.ndarray] | None = None) -> OverheadResult:
    """Generate ``n_tokens`` with one configuration; return its host time (best of warm runs).
    ``draft_window``: the draft model's proposal window (see ``sources.make_drafter``); ``windows``:
    the draft pool's :func:`device_windows` of that size, to take them as from a GPU."""
    keep_freed_memory()  # as the engine does
    target_pool, draft_pool, _ = pools
    params = SAMPLINGS[label]
    params = SamplingParams(params.temperature, params.top_k, params.top_p, params.min_p, seed)
    n_ctx = len(prompt) + n_tokens + 64
    target = SyntheticModel(target_pool, n_ctx)
    source = sources.spec(drafter)
    draft = SyntheticModel(draft_pool, n_ctx, windows) if source.uses_draft_model else None
    policy = None
    if source.chooser:
        policy = Policy(CallCosts(CostCurve(dict(GPU_CURVE))), CostEstimate(GPU_DRAFT_TOKEN))
    made = sources.make_drafter(drafter, draft, target.n_vocab, policy=policy,
                                draft_window=draft_window)
    if policy is not None:  # keep auto's costs GPU-like: the synthetic calls cost nothing
        policy.costs.observe = lambda *call: None  # type: ignore[method-assign]
        policy.lookup_cost.observe = lambda s: None  # type: ignore[method-assign]
        if policy.draft_cost is not None:
            policy.draft_cost.observe = lambda s: None  # type: ignore[method-assign]
    prefill(target, prompt)
    if draft is not None:
        draft.decode(prompt[:-1], 0)
    stats = Stats()
    rng = make_rng(seed)
    models = [m for m in (target, draft) if m is not None]
    before = sum(m.decode_seconds for m in models)
    t0 = time.perf_counter()
    produced = n_rounds = 0
    for rnd in rounds(target, made, prompt, params, rng, k, stats, n_tokens):
        produced += len(rnd.tokens)
        n_rounds += 1
        if produced >= n_tokens:
            break
    wall = time.perf_counter() - t0
    host = wall - (sum(m.decode_seconds for m in models) - before)
    return OverheadResult(drafter, k if source.drafts else 0, label, produced, n_rounds, host)


def run_overhead(n_vocab: int = DEFAULT_VOCAB, n_tokens: int = 192, repeats: int = 3,
                 drafters: Sequence[str] = DRAFTERS, samplings: Sequence[str] = tuple(SAMPLINGS),
                 lengths: Sequence[int] = LENGTHS, progress=None,
                 draft_window: int = DRAFT_WINDOW, pools=None,
                 device_window: bool = False) -> list[OverheadResult]:
    """Every (drafter, k, sampling); each the best of ``repeats`` runs (host time is noisy
    upwards only: the best run is the closest to the code's own cost). ``pools``: rows to
    use (:func:`load_pools`) instead of generated ones of ``n_vocab``. ``device_window``:
    sampled drafts get their windows as from a GPU's graph (:func:`device_windows`), not
    from whole rows on the host."""
    if device_window and not draft_window:
        raise ConfigError("a device window needs a draft window (--draft-window > 0)")
    if pools is None:
        pools = make_pools(n_vocab)
    windows = device_windows(pools[1], draft_window) if device_window else None
    prompt = make_prompt(pools[2])
    results = []
    for drafter in drafters:
        for k in (lengths if sources.spec(drafter).drafts else lengths[:1]):
            for label in samplings:
                runs = [measure(drafter, k, label, pools, prompt, n_tokens, seed=r,
                                draft_window=draft_window, windows=windows)
                        for r in range(repeats)]
                best = min(runs, key=lambda r: r.us_per_token)
                results.append(best)
                if progress is not None:
                    progress(best)
    return results


def format_table(results: Sequence[OverheadResult], n_vocab: int,
                 draft_window: int = DRAFT_WINDOW, recorded=None,
                 device_window: bool = False) -> str:
    """The results as an aligned text table (``recorded``: the file of the rows, if not
    generated; ``device_window``: the draft windows came as from a GPU)."""
    window = f"draft window {draft_window}" if draft_window else "whole draft rows"
    if device_window:
        window += " from the device"
    rows = f"rows recorded in {recorded}" if recorded is not None else "generated rows"
    lines = [f"host work per token, vocabulary {n_vocab:,}, {window}, {rows}, "
             f"{rowpass.describe()} (synthetic model: no model time)",
             f"{'drafter':8} {'k':>3} {'sampling':16} {'µs/token':>9} {'µs/round':>9} "
             f"{'tok/round':>9}"]
    for r in results:
        lines.append(f"{r.drafter:8} {r.k:>3} {r.sampling:16} {r.us_per_token:>9.1f} "
                     f"{r.us_per_round:>9.1f} {r.tokens / max(r.rounds, 1):>9.2f}")
    return "\n".join(lines)
