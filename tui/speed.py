"""The live "speed now" rate of a turn.

The speedup the chat shows is the engine's own (``Stats.speedup``): the turn's speed against
target-only decoding estimated from the turn's own target calls, at the same moment
(:mod:`edgespec.core.speedup`); nothing is measured apart from the turn for it.
"""

from __future__ import annotations

from collections import deque


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
