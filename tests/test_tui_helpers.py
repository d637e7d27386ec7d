"""Helpers for the chat app's tests: a fake engine over the scripted fake models, a simulated
clock for deterministic timings, and ``wait_until``. (The tests at the end check the helpers.)

The fake engine is the real :class:`edgespec.Engine` (drafters, round loop, rejection test,
stats, provenance) over :class:`tests.fakes.TimedLM` models with a small word vocabulary, so
the app sees exactly the chunks and stats a real engine would produce, in milliseconds.
"""

from __future__ import annotations

import asyncio
import threading
import time

from edgespec.core.rejection import Source
from edgespec.core.sampling import SamplingParams
from edgespec.runtime.engine import Engine

from .fakes import TimedLM, Clock, Perturbed, Table

BOS, EOG = 0, 1
WORDS = ["<s>", "</s>", " the", " draft", " model", " guesses", " tokens", ",", " and", " target",
         " checks", " them", ".", "\n", " fast", " speculative", " decoding", " is", " exact",
         " a", " of", " with", " one", " pass", " cache", " `code`", " **bold**", " list", " it",
         " keeps", " small", " big"]
VOCAB = [w.encode() for w in WORDS]

#: Simulated seconds per target call of any width (one verification round) and per prefill.
#: Nothing else takes time on the fake engine's clock, so target-only decoding runs at
#: ``1 / ROUND_TIME`` tokens/s and the speedup of a speculative turn is its tokens per round:
#: deterministic numbers for the panel and for snapshots.
#: (Powers of two: sums of them are exact in floating point.)
ROUND_TIME = 0.0625
PREFILL_TIME = 0.125


class SlowFakeLM(TimedLM):
    """A clocked fake whose ``decode`` also sleeps ``delay`` real seconds, and can be held at a
    gate (``gate.clear()``, or ``hold_after = n`` decode calls) to freeze generation mid-answer."""

    def __init__(self, *args, delay: float = 0.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.delay = delay
        self.gate = threading.Event()
        self.gate.set()
        self.hold_after: int | None = None  # close the gate once this many decodes have run

    def decode(self, tokens, n_logits):
        if self.hold_after is not None and len(self.calls) >= self.hold_after:
            self.hold_after = None
            self.gate.clear()
        self.gate.wait(30)
        if self.delay:
            time.sleep(self.delay)
        return super().decode(tokens, n_logits)


def fake_models(clock: Clock, *, n_ctx: int = 1024, delay: float = 0.0, seed: int = 3,
                scale: float = 1.0):
    """A target (:data:`ROUND_TIME` a call, :data:`PREFILL_TIME` a prefill on ``clock``) and a
    partly agreeing draft (no simulated time) over :data:`VOCAB` (BOS and EOG never generated:
    answers run to ``max_tokens`` or the end of the context)."""
    table = Table(len(VOCAB), seed, banned=[BOS, EOG])
    words = dict(n_ctx=n_ctx, vocab=VOCAB, eog=[EOG], bos=BOS)
    target = SlowFakeLM(table, clock, lambda n: ROUND_TIME, prefill=PREFILL_TIME, delay=delay,
                        **words)
    draft = SlowFakeLM(Perturbed(table, seed, scale), clock, lambda n: 0.0, **words)
    return target, draft


def fake_engine(*, drafter: str = "hybrid", draft_length: int = 4, with_draft: bool = True,
                **kwargs) -> Engine:
    """The engine over :func:`fake_models` on a simulated clock, its costs measured as
    ``Engine.load`` measures them for the chat (a flat curve of ROUND_TIME)."""
    clock = Clock()
    target, draft = fake_models(clock, **kwargs)
    engine = Engine(target, draft if with_draft else None, drafter=drafter,
                    draft_length=draft_length, clock=clock)
    engine.calibrate()
    return engine


async def wait_until(pilot, predicate, timeout: float = 20.0, what: str = "") -> None:
    """Let the app run until ``predicate()`` holds (no fixed sleeps)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        await pilot.pause(0.02)


def drive(app, scenario, size: tuple[int, int] = (80, 24)) -> None:
    """Run ``scenario(pilot)`` against ``app`` headless (plain pytest: no async plugin needed)."""

    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await scenario(pilot)

    asyncio.run(main())


def record_notifications(app) -> list[tuple[str, str, str]]:
    """Keep every notification as ``(message, severity, title)`` (they are not shown headless)."""
    seen: list[tuple[str, str, str]] = []
    original = app.notify

    def notify(message, *args, **kwargs):
        seen.append((str(message), kwargs.get("severity", "information"), kwargs.get("title", "")))
        return original(message, *args, **kwargs)

    app.notify = notify
    return seen


def panel_text(app) -> str:
    """The stats panel as plain text."""
    return "\n".join(line.plain for line in app.panel.build().renderables)


async def type_and_send(pilot, text: str) -> None:
    pilot.app.prompt_input.value = text
    await pilot.press("enter")


async def until_ready(pilot, timeout: float = 20.0) -> None:
    await wait_until(pilot, lambda: pilot.app.engine is not None, timeout, "the engine to load")


async def until_answered(pilot, entries: int, timeout: float = 20.0) -> None:
    app = pilot.app
    await wait_until(pilot, lambda: app.turn is None and len(app.conversation) >= entries, timeout,
                     f"{entries} conversation entries")
    await pilot.pause()


# ---- the helpers' own checks ------------------------------------------------------------------


def test_fake_engine_is_deterministic_and_speculates():
    greedy = SamplingParams(temperature=0)
    runs = [fake_engine().complete([{"role": "user", "content": "hi"}], max_tokens=30, sampling=greedy)
            for _ in range(2)]
    assert runs[0].text == runs[1].text and len(runs[0].tokens) == 30
    stats = runs[0].stats
    assert stats.time_total == PREFILL_TIME + stats.rounds * ROUND_TIME
    assert 0 < stats.accepted < stats.drafted  # partial agreement: some drafts rejected
    assert {t.source for t in runs[0].tokens} >= {Source.DRAFT, Source.CORRECTED}
    baseline = fake_engine().complete("hi", drafter="none", max_tokens=16, sampling=greedy)
    assert baseline.stats.tokens_per_second == 1 / ROUND_TIME
