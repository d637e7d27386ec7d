"""Running statistics of a generation: what the drafter proposed, what it bought, where time went."""

from __future__ import annotations

from dataclasses import dataclass, field

from .speedup import Speedup, TargetCalls, same_moment_speedup


@dataclass
class SourceStats:
    """Per-drafter counts (``hybrid`` mixes ``lookup`` and ``model`` rounds; ``none`` counts the
    plain steps), and the seconds of their rounds' drafting, target calls and sampling."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    time_drafting: float = 0.0
    time_target: float = 0.0
    time_sampling: float = 0.0


@dataclass
class Stats:
    """Counters and timers, updated in place while tokens stream.

    ``accepted_hist[n]`` counts rounds in which exactly n drafted tokens were accepted (rounds
    with nothing drafted count under 0); ``drafted_hist[k]`` counts rounds that drafted k tokens
    (what ``auto`` chose). Times are seconds of wall clock; ``time_llama`` is the part of the
    decoding time spent inside llama.cpp's decode calls (target and draft).

    ``calls`` holds what the target calls say of a plain step's cost now; ``eog``: an
    end-of-generation token ended the answer (not in ``generated``). With them, :attr:`speedup`
    is measured against target-only decoding at the same moment (:mod:`edgespec.core.speedup`).
    """

    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    generated: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_hist: list[int] = field(default_factory=list)
    drafted_hist: list[int] = field(default_factory=list)
    by_drafter: dict[str, SourceStats] = field(default_factory=dict)
    time_prefill: float = 0.0
    time_drafting: float = 0.0
    time_target: float = 0.0
    time_sampling: float = 0.0
    time_total: float = 0.0
    time_llama: float = 0.0
    calls: TargetCalls = field(default_factory=TargetCalls)
    eog: bool = False

    def record_round(self, drafter: str, drafted: int, accepted: int, t_draft: float = 0.0,
                     t_target: float = 0.0, t_sampling: float = 0.0) -> None:
        """Count one verification round, and its seconds drafting, in the target call and
        sampling."""
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        self.time_drafting += t_draft
        self.time_target += t_target
        self.time_sampling += t_sampling
        if len(self.accepted_hist) <= accepted:
            self.accepted_hist.extend([0] * (accepted + 1 - len(self.accepted_hist)))
        self.accepted_hist[accepted] += 1
        if len(self.drafted_hist) <= drafted:
            self.drafted_hist.extend([0] * (drafted + 1 - len(self.drafted_hist)))
        self.drafted_hist[drafted] += 1
        src = self.by_drafter.get(drafter)
        if src is None:  # (not setdefault: that would make a SourceStats every round)
            src = self.by_drafter[drafter] = SourceStats()
        src.rounds += 1
        src.drafted += drafted
        src.accepted += accepted
        src.time_drafting += t_draft
        src.time_target += t_target
        src.time_sampling += t_sampling

    @property
    def plain(self) -> SourceStats:
        """The plain steps: rounds that drafted nothing."""
        return self.by_drafter.get("none") or SourceStats()

    @property
    def speedup(self) -> Speedup | None:
        """Speed against target-only decoding at the same moment, from this generation's own
        target calls (:func:`~edgespec.core.speedup.same_moment_speedup`); ``None`` before a
        round, or where speculative rounds ran with too few plain steps and no cost curve."""
        return same_moment_speedup(self)

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted(self) -> float:
        """Mean accepted draft tokens per round."""
        return self.accepted / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_round(self) -> float:
        """Mean emitted tokens per target call (1 for plain decoding)."""
        return self.generated / self.rounds if self.rounds else 0.0

    @property
    def decode_time(self) -> float:
        """Time spent generating, excluding the prompt prefill."""
        return max(self.time_total - self.time_prefill, 0.0)

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens per second of decoding (prefill excluded)."""
        t = self.decode_time
        return self.generated / t if t > 0 else 0.0

    @property
    def python_overhead(self) -> float:
        """Fraction of the decoding time spent outside llama.cpp's decode calls."""
        t = self.decode_time
        return max(t - self.time_llama, 0.0) / t if t > 0 else 0.0

    @property
    def time_other(self) -> float:
        """Decoding time outside drafting, target calls and sampling (Python overhead)."""
        busy = self.time_drafting + self.time_target + self.time_sampling
        return max(self.decode_time - busy, 0.0)

    def to_dict(self) -> dict:
        """JSON-ready summary with stable names (used by ``--json`` and the stats line)."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "generated": self.generated,
            "rounds": self.rounds,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_accepted": round(self.mean_accepted, 4),
            "tokens_per_round": round(self.tokens_per_round, 4),
            "accepted_hist": list(self.accepted_hist),
            "drafted_hist": list(self.drafted_hist),
            "by_drafter": {
                k: {"rounds": v.rounds, "drafted": v.drafted, "accepted": v.accepted}
                for k, v in self.by_drafter.items()
            },
            "tokens_per_second": round(self.tokens_per_second, 3),
            "time": {
                "prefill": round(self.time_prefill, 4),
                "drafting": round(self.time_drafting, 4),
                "target": round(self.time_target, 4),
                "sampling": round(self.time_sampling, 4),
                "other": round(self.time_other, 4),
                "llama": round(self.time_llama, 4),
                "total": round(self.time_total, 4),
            },
            "python_overhead": round(self.python_overhead, 4),
            "speedup": speedup.to_dict() if (speedup := self.speedup) is not None else None,
        }

    def summary(self) -> str:
        """One line for humans."""
        line = (
            f"{self.generated} tokens in {self.decode_time:.2f}s "
            f"({self.tokens_per_second:.1f} tok/s, prefill {self.prompt_tokens} tok "
            f"{self.time_prefill:.2f}s) | rounds {self.rounds}, drafted {self.drafted}, "
            f"accepted {self.accepted} ({100 * self.acceptance_rate:.0f}%), "
            f"{self.tokens_per_round:.2f} tok/round | {self.speedup_text()}"
        )
        return line

    def speedup_text(self) -> str:
        """``2.10x vs target-only (measured in turn, 42 steps)``, or why there is no figure."""
        speedup = self.speedup
        if speedup is not None:
            return f"{speedup.ratio:.2f}x vs target-only ({speedup.basis_text})"
        if self.rounds == 0:
            return "speedup n/a (no round)"
        return "speedup n/a (too few plain steps, no cost curve)"
