"""At most one screen update per interval while an answer streams.

Each chunk of an answer used to redraw the answer and the stats panel at once. Textual's
redraw (a layout pass for a growing answer, then every changed line) takes the interface
thread several milliseconds a chunk, on the same cores as llama.cpp's threads: on a machine
with few cores the chat decoded markedly slower than ``edgespec complete``. Chunks still
update the data as they come; what the screen shows is drawn at most once per interval: at
once when the last draw is that old, else at the end of the interval, so the newest state is
always the one drawn.
"""

from __future__ import annotations

import time
from typing import Callable

from textual.message_pump import MessagePump
from textual.timer import Timer


class Throttle:
    """Calls ``draw`` at most once per ``interval`` seconds, never later than one interval
    after a request (``__call__``); :meth:`cancel` drops a draw that is due."""

    def __init__(self, owner: MessagePump, interval: float, draw: Callable[[], None]) -> None:
        self.owner, self.interval, self.draw = owner, interval, draw
        self._last = float("-inf")
        self._timer: Timer | None = None

    def __call__(self) -> None:
        if self._timer is not None:
            return  # a draw is already due; it will show this state too
        wait = self._last + self.interval - time.monotonic()
        if wait <= 0:
            self._draw()
        else:
            self._timer = self.owner.set_timer(wait, self._draw)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._timer = None

    def _draw(self) -> None:
        self._timer = None
        self._last = time.monotonic()
        self.draw()
