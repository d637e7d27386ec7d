"""Defaults in one place. Everything user-tunable has its DEFAULT_* here."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_PAIR = "default"
DEFAULT_DRAFTER = "auto"
DEFAULT_DRAFT_LENGTH = 4  #: for fixed drafters; ``auto`` chooses k per round
AUTO_MAX_DRAFT_LENGTH = 32  #: the longest draft ``auto`` considers
#: t(n) points measured at start-up, most useful first, within the time budget
CALIBRATION_POINTS = (1, 4, 16, 32, 8)
CALIBRATION_BUDGET_S = 0.4
#: passes over CALIBRATION_POINTS, each point their median, as far as the budget goes (on a
#: 2-core CPU the first pass spends it; on a GPU, where the first pass always runs, a deep
#: model's too)
CALIBRATION_REPEATS = 5
#: the draft model's per-token cost: repeated runs of 3 tokens while they fit (one on a small CPU)
DRAFT_CALIBRATION_BUDGET_S = 0.05
DEFAULT_MAX_NGRAM = 8
DEFAULT_MIN_NGRAM = 2
DEFAULT_MAX_TOKENS = 512
DEFAULT_N_CTX = 4096
DEFAULT_N_BATCH = 512
DEFAULT_TEMPERATURE = 0.0
DEFAULT_TOP_K = 0
DEFAULT_TOP_P = 1.0
DEFAULT_MIN_P = 0.0
#: the tokens repeat, presence and frequency penalties look back over (llama.cpp's default)
DEFAULT_PENALTY_LAST_N = 64
#: most alternatives ``top_logprobs`` may ask for (OpenAI's limit)
MAX_TOP_LOGPROBS = 20

#: Widest --fixed-width: a round of the longest draft fits one call (llama.cpp's backend sampler
#: picks from at most MAX_SAMPLED_ROWS rows per call).
MAX_FIXED_WIDTH = 64

#: The fixed width --exact uses where the target's kernels depend on batch width (a GPU, RPC
#: workers). On an H200 (default pair, 2026-11-26) W = 8 gave auto 451 tok/s (geometric mean of
#: the bench prompts) and W = 16 gave 415; a plain step costs 3.5 ms at W = 8 against 2.0 ms.
EXACT_FIXED_WIDTH = 8

#: A sampled draft model proposes from its this many most likely tokens (ties included): the
#: exact test allows any proposal distribution, and this one costs a threshold pass over the
#: row instead of whole-row work (see edgespec.core.sampling.draft_distribution). 0 = the
#: whole row.
DRAFT_WINDOW = 64

#: Recurrent-state snapshots a hybrid model's context keeps where its calls are not the CPU's
#: pieces (a GPU): the longest draft it then plays. Each snapshot is one more copy of the
#: recurrent state (a 9B Qwen3.5: ~50 MB), so the state's memory grows x(1 + this).
RECURRENT_SNAPSHOTS = 8

#: Checkpoints of the recurrent state a hybrid model's context keeps (one after each prefill
#: call): a prompt that diverges inside the cache reads again from the last one before it.
RECURRENT_CHECKPOINTS = 4

#: Hard ceiling on draft length: beyond this the exact test's acceptance
#: probability for the tail is negligible and the batch only costs time.
MAX_DRAFT_LENGTH = 64


def default_threads() -> int:
    """Threads for llama.cpp: one per available core (hyper-threads rarely help)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def cache_dir() -> Path:
    """Where downloaded models and build artefacts live: never inside the repository.

    ``EDGESPEC_CACHE`` wins, then ``$XDG_CACHE_HOME/edgespec``, then ``~/.cache/edgespec``.
    """
    env = os.environ.get("EDGESPEC_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "edgespec"
