"""What the speedup figure is measured against, and the live "tokens/s now" rate.

The speedup shown in the chat is ``turn tokens/s / target-only tokens/s``, both with the prompt
prefill excluded (``Stats.tokens_per_second``). The target-only rate comes from a
:class:`Baseline`: a short greedy calibration with drafter ``none`` right after the models load,
replaced by the measured rate of any chat turn run with drafter ``none``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from edgespec.core.sampling import SamplingParams
from edgespec.core.stats import Stats

#: A fixed, neutral prompt whose greedy answer is long enough for the calibration.
CALIBRATION_PROMPT = "Count from 1 to 100, separated by commas."
DEFAULT_CALIBRATION_TOKENS = 16
#: A ``none`` turn shorter than this does not replace the baseline (too noisy).
MIN_BASELINE_TOKENS = 8


@dataclass(frozen=True)
class Baseline:
    """Target-only decoding speed and where it comes from."""

    tokens_per_second: float
    tokens: int
    source: str  # "calibration" | "turn"
    turn: int | None = None

    @property
    def basis(self) -> str:
        """A short phrase for the panel: how the baseline was measured."""
        if self.source == "calibration":
            return f"start-up calibration, {self.tokens} tok"
        return f"measured turn {self.turn}, {self.tokens} tok"

    def speedup(self, tokens_per_second: float) -> float | None:
        if self.tokens_per_second <= 0 or tokens_per_second <= 0:
            return None
        return tokens_per_second / self.tokens_per_second


def calibrate(engine, tokens: int = DEFAULT_CALIBRATION_TOKENS) -> Baseline | None:
    """Time ``tokens`` greedy target-only tokens on :data:`CALIBRATION_PROMPT`.

    Costs one prefill of a short prompt; the chat's next turn re-prefills its own prompt
    anyway (the engine reuses the longest shared KV prefix, which here is just the template head).
    """
    result = engine.complete(CALIBRATION_PROMPT, drafter="none", max_tokens=tokens,
                             sampling=SamplingParams(temperature=0.0))
    stats = result.stats
    if stats.generated < 2 or stats.tokens_per_second <= 0:
        return None
    return Baseline(stats.tokens_per_second, stats.generated, "calibration")


def baseline_from_turn(stats: Stats, turn: int) -> Baseline | None:
    """A baseline from a chat turn decoded with drafter ``none`` (None if too short)."""
    if stats.generated < MIN_BASELINE_TOKENS or stats.tokens_per_second <= 0:
        return None
    return Baseline(stats.tokens_per_second, stats.generated, "turn", turn)


class RollingRate:
    """Tokens per second over the last ``window`` seconds of the engine's own clock.

    Fed with ``(stats.time_total, stats.generated)`` after each chunk, so the rate uses the
    same timings as the engine's stats (and is deterministic when those are).
    """

    def __init__(self, window: float = 1.0) -> None:
        self.window = window
        self.points: deque[tuple[float, int]] = deque()

    def start(self, t0: float) -> None:
        """Start a turn at ``t0`` (decoding starts after the prefill)."""
        self.points.clear()
        self.points.append((t0, 0))

    def add(self, t: float, generated: int) -> None:
        self.points.append((t, generated))
        # keep one point at or before the window start, so the window is always covered
        while len(self.points) > 2 and self.points[1][0] <= t - self.window:
            self.points.popleft()

    @property
    def rate(self) -> float | None:
        if len(self.points) < 2:
            return None
        (t0, g0), (t1, g1) = self.points[0], self.points[-1]
        return (g1 - g0) / (t1 - t0) if t1 > t0 else None
