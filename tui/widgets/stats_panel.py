"""The speculation panel: what the drafter did this turn and what it bought.

Every number comes from the engine's :class:`edgespec.core.stats.Stats` for the current (or last)
turn, "speed now" included (the same counters over the last second of the engine's clock), and
the speedup and target-only speed are the stats' own (``Stats.speedup``: target-only decoding
estimated from the turn's own target calls, at the same moment).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rich.console import Group
from rich.text import Text
from textual.widgets import Static

from edgespec import config
from edgespec.core.speedup import Speedup
from edgespec.core.stats import Stats
from tui.widgets.message import DRAFT_STYLE

LABEL = 15  # label column width
VALUE = 17  # value column width
WIDTH = LABEL + VALUE
BARS = "▁▂▃▄▅▆▇█"


@dataclass
class TurnView:
    """The turn the panel shows: its settings, live stats and per-round accepted counts."""

    number: int
    drafter: str
    draft_length: int | None  #: None: chosen per round by ``auto``
    stats: Stats = field(default_factory=Stats)
    now: float | None = None
    recent: list[int] = field(default_factory=list)
    finish: str | None = None  # None while streaming

    @property
    def streaming(self) -> bool:
        return self.finish is None


def fmt_k(k: int | None, drafter: str = "auto") -> str:
    """The draft length as the engine will use it: None is auto's choice, or the default k."""
    if k is not None:
        return str(k)
    return "auto" if drafter == "auto" else str(config.DEFAULT_DRAFT_LENGTH)


def fmt_rate(rate: float | None) -> str:
    return "–" if rate is None or rate <= 0 else f"{rate:.1f} tok/s"


def row(label: str, value: str | Text, style: str = "") -> Text:
    value = value if isinstance(value, Text) else Text(value, style=style)
    value.align("right", VALUE)
    return Text.assemble((label.ljust(LABEL), "dim"), value)


def histogram(hist: list[int], k: int, width: int = WIDTH) -> tuple[Text, Text]:
    """Two lines: bucket labels (accepted drafts per round) and a bar per bucket."""
    buckets = list(hist) + [0] * max(0, k + 1 - len(hist))
    n = len(buckets)
    size = max(1, math.ceil(n / 10))  # at most 10 columns: merge buckets beyond that
    groups = [(i, sum(buckets[i:i + size])) for i in range(0, n, size)]
    col = max(len(str(i)) for i, _ in groups) + 1
    top = max(c for _, c in groups) or 1
    labels, bars = Text(), Text()
    for i, count in groups:
        labels.append(str(i).ljust(col), style="dim")
        if count == 0:
            bars.append("·".ljust(col), style="dim")
        else:
            level = max(1, math.ceil(len(BARS) * count / top)) - 1
            bars.append(BARS[level].ljust(col), style=DRAFT_STYLE)
    return labels, bars


def sparkline(values: list[int], k: int, width: int) -> Text:
    """Accepted drafts per round, most recent last, scaled to the draft length."""
    text = Text()
    for v in values[-width:]:
        level = round((len(BARS) - 1) * min(v, k) / k) if k else 0
        text.append(BARS[level], style=DRAFT_STYLE if v else "dim")
    return text


class StatsPanel(Static):
    """Renders the panel from the app's state; call :meth:`show` to update."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = "speculation"
        self.drafter = "auto"
        self.draft_length: int | None = None
        self.temperature = 0.0
        self.coloured = True
        self.note: str | None = "loading…"  #: said under target-only before a turn (None: nothing)
        self.n_ctx: int | None = None
        self.turn: TurnView | None = None

    def show(self, **changes) -> None:
        for name, value in changes.items():
            if not hasattr(self, name):
                raise AttributeError(name)
            setattr(self, name, value)
        self.update(self.build())

    def speedup(self) -> Speedup | None:
        return self.turn.stats.speedup if self.turn is not None else None

    def build(self) -> Group:
        lines: list[Text] = [
            Text.assemble(("next  ", "dim"), f"{self.drafter} · k={fmt_k(self.draft_length, self.drafter)} · "
                          f"temp {self.temperature:g}"),
        ]
        turn = self.turn
        if turn is None:
            lines.append(Text("no turn yet", style="dim italic"))
        else:
            state = "streaming" if turn.streaming else turn.finish
            lines.append(Text(f"turn {turn.number} · {turn.drafter} k={fmt_k(turn.draft_length, turn.drafter)} · {state}",
                              style="bold"))
        s = turn.stats if turn else Stats()
        lines.append(row("speed now", fmt_rate(turn.now if turn and turn.streaming else None)))
        lines.append(row("speed turn", fmt_rate(s.tokens_per_second if turn else None)))
        speedup = self.speedup()
        if speedup is not None:
            lines.append(row("target-only", fmt_rate(speedup.target_only_tokens_per_second)))
            lines.append(Text(f" ({speedup.basis_text})", style="dim"))
            ratio = speedup.ratio
            style = "bold green" if ratio >= 1.05 else "bold red" if ratio < 0.95 else "bold"
            lines.append(row("speedup", f"{ratio:.2f}×", style))
        else:
            lines.append(row("target-only", "–" if turn is None or not s.rounds else "n/a"))
            if turn is None:
                why = self.note or "measured in each turn"
            else:
                why = "no round yet" if not s.rounds else "few plain steps, no curve"
            lines.append(Text(f" ({why})", style="dim"))
            lines.append(row("speedup", "–" if turn is None or not s.rounds else "n/a", "bold"))
        drafting = turn is not None and turn.drafter != "none" and turn.draft_length != 0
        lines.append(row("acceptance", f"{100 * s.acceptance_rate:.0f}%" if drafting and s.drafted else "–"))
        lines.append(row("accepted/round", f"{s.mean_accepted:.2f}" if drafting and s.rounds else "–"))
        lines.append(row("drafted", str(s.drafted)))
        lines.append(row("accepted", str(s.accepted)))
        used_drafters = {name: v for name, v in s.by_drafter.items() if v.drafted}
        if len(used_drafters) > 1:  # hybrid, auto: what lookup and the model each contributed
            parts = [f"{name} {v.accepted}/{v.drafted}" for name, v in sorted(used_drafters.items())]
            lines.append(Text(" " + " · ".join(parts), style="dim"))
        used = s.prompt_tokens + s.generated if turn else 0
        lines.append(row("context", f"{used}/{self.n_ctx}" if self.n_ctx else "–"))
        decode = s.decode_time
        if turn is not None and decode > 0:  # where the decoding time went
            lines.append(Text.assemble(("time  ", "dim"), f"draft {s.time_drafting / decode:.0%} · "
                                       f"target {s.time_target / decode:.0%}"))
        else:
            lines.append(Text("time  –", style="dim"))
        lines.append(Text("accepted drafts per round", style="dim"))
        if drafting:
            k = turn.draft_length or max(len(s.drafted_hist) - 1, 1)  # None: the longest drafted
            labels, bars = histogram(s.accepted_hist, k)
            lines += [labels, bars]
            lines.append(Text.assemble(("recent ", "dim"), sparkline(turn.recent, k, WIDTH - 7)))
        else:
            lines += [Text(" (no drafting)", style="dim"), Text(""), Text("")]
        if self.coloured:
            lines.append(Text.assemble(("■", DRAFT_STYLE), " drafted  ", ("■", ""), " target",
                                       ("  ctrl+o", "dim")))
        else:
            lines.append(Text("colours off (ctrl+o)", style="dim"))
        return Group(*lines)
