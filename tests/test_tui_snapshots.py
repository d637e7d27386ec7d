"""Snapshot tests (pytest-textual-snapshot) of the chat's main screen and its help screen.

Deterministic: the fake engine runs on a simulated clock (tests/test_tui_helpers.fake_engine),
greedy, and a mid-answer screen is frozen at a fixed decode call. Update the SVGs in
tests/__snapshots__/ with ``pytest tests/test_tui_snapshots.py --snapshot-update`` after checking
the new screens by eye.
"""

from __future__ import annotations

import threading
import time

from tui.app import ChatApp, ChatSettings

from .test_tui_helpers import fake_engine, type_and_send, until_answered, until_ready, wait_until

PROMPT = "What does the drafter do?"


def make_app(engine=None, max_tokens: int = 48) -> ChatApp:
    engine = engine or fake_engine()
    # hybrid, k=4: auto's choices follow the wall clock, snapshots must not
    return ChatApp(lambda: engine, ChatSettings(max_tokens=max_tokens, drafter="hybrid", draft_length=4),
                   model_label="fake target + fake draft")


async def answered(pilot) -> None:
    await until_ready(pilot)
    pilot.app.prompt_input.cursor_blink = False
    await type_and_send(pilot, PROMPT)
    await until_answered(pilot, 2)


def test_main_screen_after_an_answer_80x24(snap_compare):
    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=answered)


def test_main_screen_after_an_answer_120x40(snap_compare):
    assert snap_compare(make_app(), terminal_size=(120, 40), run_before=answered)


def test_main_screen_mid_answer_100x30(snap_compare):
    engine = fake_engine()
    target = engine.target

    async def mid_answer(pilot) -> None:
        await until_ready(pilot)
        pilot.app.prompt_input.cursor_blink = False
        target.hold_after = len(target.calls) + 12
        await type_and_send(pilot, PROMPT)
        await wait_until(pilot, lambda: not target.gate.is_set() and pilot.app.turn is not None
                         and pilot.app.turn.view.stats.rounds >= 10)
        for _ in range(3):
            await pilot.pause()

    app = make_app(engine, max_tokens=400)
    # once the screenshot is taken and the app exits, let the frozen worker thread finish
    threading.Thread(target=release_on_exit, args=(app, target), daemon=True).start()
    try:
        assert snap_compare(app, terminal_size=(100, 30), run_before=mid_answer)
    finally:
        target.gate.set()


def release_on_exit(app, target) -> None:
    deadline = time.monotonic() + 60
    while app.return_code is None and time.monotonic() < deadline:
        time.sleep(0.01)
    target.gate.set()


def test_main_screen_colours_off_markdown_80x24(snap_compare):
    async def plain(pilot) -> None:
        await answered(pilot)
        await pilot.press("ctrl+o")
        message = pilot.app.query("AssistantMessage").last()
        await wait_until(pilot, lambda: message.settled)
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=plain)


def test_help_screen_80x24(snap_compare):
    async def help_open(pilot) -> None:
        await until_ready(pilot)
        pilot.app.prompt_input.cursor_blink = False
        await pilot.press("f1")
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=help_open)
