"""The speedup over target-only decoding, measured at the same moment as the turn it describes.

A figure taken against a speed measured earlier compares two moments: another process, a longer
context, a laptop's clocks or a GPU's warm-up move one side of the ratio and not the other. So
the target-only speed is estimated from the turn's own target calls:

- **measured in turn**: the turn's plain steps (rounds that drafted nothing) are direct samples
  of what target-only decoding pays per token now, at this context: their mean target call t(1),
  with their sampling and a per-round share of the loop's other time. Where the calibration
  found that a call of a new width costs more (a GPU's CUDA graphs: U for the first call of a
  width, C for the second; :class:`~edgespec.core.costs.CallCosts`), only plain calls that
  replayed a graph count, as every call of plain decoding does; a plain step just after a
  drafting round paid the change of width, which plain decoding never pays;
- **derived from the curve**: with fewer plain steps than :attr:`BaselineRule.min_plain_steps`,
  every target call of the turn is converted to t(1) by the calibrated cost curve's shape: a
  call of n tokens counts as t(n) / t(1) plain calls, and t(1) now is the calls' seconds over
  those counts (contention and clock changes scale all widths alike; the curve's absolute
  figures, from another moment, cancel out). The shape is the calibration's, whose points
  were measured together, not the curve ``auto`` refines as it plays (its widths would follow
  a slowdown before its t(1) does); a call that paid for a change of width counts less that.

The estimate of target-only time for the turn keeps the plain steps at what they cost (less
the switch penalties they paid) and replaces each speculative round by as many plain steps as
it delivered tokens::

    target-only = decode time - (speculative rounds' time) - (plain steps' change-of-width costs)
                  + (the speculative rounds' tokens) * (one plain step)
    speedup     = target-only / decode time

A turn with nothing drafted has no speculative round: both sides are the same number, and the
ratio is exactly 1. (A plain step under ``auto`` counts its proposal bookkeeping on both sides,
~0.1% of a step on a CPU.) The tokens a round delivered include an end-of-generation token
that ended the answer: plain decoding pays a step for it too.
"""

from __future__ import annotations

from dataclasses import dataclass

from .costs import CallCosts

MEASURED = "measured"
CURVE = "curve"


@dataclass(frozen=True)
class BaselineRule:
    """When the turn's own plain steps are the baseline: at least ``min_plain_steps`` of them
    (fewer are too noisy alone; the curve then converts every call of the turn)."""

    min_plain_steps: int = 8


@dataclass
class TargetCalls:
    """A generation's target calls as evidence of what a plain step's call costs now.

    ``plain``, ``plain_seconds``: the plain calls that replayed a graph (or ran where there are
    none), and their seconds; ``plain_penalties``: what the other plain calls paid for a change
    of width (plain decoding pays none); ``units``: every call in plain calls by the calibrated
    curve's shape, S(n) / S(1) (``None`` without costs); ``unit_seconds``: their seconds, each
    less what it paid for a change of width."""

    plain: int = 0
    plain_seconds: float = 0.0
    plain_penalties: float = 0.0
    units: float | None = None
    unit_seconds: float = 0.0


class CallMeter:
    """Adds each target call of a generation to its :class:`TargetCalls`, knowing the calibrated
    call costs (or ``None``): which calls paid for a change of width, and how much (U or C)."""

    def __init__(self, costs: CallCosts | None, calls: TargetCalls) -> None:
        self.costs, self.calls = costs, calls
        if costs is not None and calls.units is None:
            calls.units = 0.0
        self._t1 = costs.steady(1) if costs is not None else 0.0
        self._last: int | None = None  #: width of the last call (None: the prefill's)
        self._run = 0  #: calls of that width in a row

    def add(self, n: int, seconds: float) -> None:
        """One call that scored n tokens in ``seconds``."""
        calls, costs = self.calls, self.costs
        paid = 0.0
        if costs is not None and costs.graphs:
            shape = costs.shape(n)
            paid = costs.excess(shape, self._last, self._run)
            self._run = self._run + 1 if shape == self._last else 1
            self._last = shape
        if n == 1 and not paid:
            calls.plain += 1
            calls.plain_seconds += seconds
        elif n == 1:
            calls.plain_penalties += paid
        if costs is not None:
            calls.units += 1.0 if n == 1 else costs.steady(n) / self._t1
            calls.unit_seconds += seconds - paid


@dataclass(frozen=True)
class Speedup:
    """A turn's speed against target-only decoding's at the same moment.

    ``target_only_seconds``: what plain decoding would have taken for the turn's tokens;
    ``seconds``: what the turn took (prefill excluded); ``basis``: :data:`MEASURED` (the turn's
    plain steps) or :data:`CURVE` (all its target calls through the cost curve's shape);
    ``samples``: the plain steps, or the target calls, it rests on."""

    target_only_seconds: float
    seconds: float
    tokens: int
    basis: str
    samples: int

    @property
    def ratio(self) -> float:
        return self.target_only_seconds / self.seconds

    @property
    def target_only_tokens_per_second(self) -> float:
        return self.tokens / self.target_only_seconds if self.target_only_seconds > 0 else 0.0

    @property
    def basis_text(self) -> str:
        """How the baseline was obtained, in a few words (the chat's panel, ``--stats``)."""
        if self.basis == MEASURED:
            return f"measured in turn, {self.samples} steps"
        return f"derived from curve, {self.samples} calls"

    def to_dict(self) -> dict:
        return {
            "ratio": round(self.ratio, 4),
            "basis": self.basis,
            "samples": self.samples,
            "target_only_tokens_per_second": round(self.target_only_tokens_per_second, 3),
            "target_only_seconds": round(self.target_only_seconds, 4),
        }


def same_moment_speedup(stats, rule: BaselineRule = BaselineRule()) -> Speedup | None:
    """The speedup of a generation (its :class:`~edgespec.core.stats.Stats`, which call this:
    not imported here) over target-only decoding from its own calls (see the module
    docstring); ``None`` before a round has run, or when speculative rounds ran with fewer plain
    steps than ``rule`` needs and no cost curve to convert their calls (``stats.calls``)."""
    seconds = stats.decode_time
    if stats.rounds == 0 or seconds <= 0:
        return None
    plain = stats.plain
    spec_rounds = stats.rounds - plain.rounds
    if spec_rounds == 0:  # plain decoding: its own baseline
        return Speedup(seconds, seconds, stats.generated, MEASURED, plain.rounds)
    calls = stats.calls
    if calls.plain >= rule.min_plain_steps:
        t1, basis, samples = calls.plain_seconds / calls.plain, MEASURED, calls.plain
    elif calls.units:
        t1, basis, samples = calls.unit_seconds / calls.units, CURVE, stats.rounds
    else:
        return None
    other = stats.time_other / stats.rounds  # per round: the loop's and its caller's own time
    spec_target = stats.time_target - plain.time_target
    spec_sampling = stats.time_sampling - plain.time_sampling
    spec_drafting = stats.time_drafting - plain.time_drafting
    # what a plain step samples: the turn's own, else a verification's (one full row and the
    # pending rows of its drafts: a little more)
    sampling = (plain.time_sampling / plain.rounds if plain.rounds
                else spec_sampling / spec_rounds)
    step = t1 + sampling + other
    spec_time = spec_target + spec_sampling + spec_drafting + spec_rounds * other
    spec_tokens = max(stats.generated + int(stats.eog) - plain.rounds, 0)
    target_only = max(seconds - spec_time - calls.plain_penalties, 0.0) + spec_tokens * step
    return Speedup(target_only, seconds, stats.generated, basis, samples)
