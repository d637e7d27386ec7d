"""Pilot tests of ``edgespec chat`` over a fake engine (the real Engine over scripted fake models,
with a fixed clock): loading, streaming, the stats panel, stop, drafter switching, context
limits, every key binding, slash commands, saving.
"""

from __future__ import annotations

import io
import json
import threading
import time

import pytest
from click.testing import CliRunner
from rich.console import Console
from textual import events
from textual.widgets import LoadingIndicator, Markdown

from edgespec.cli.main import cli
from edgespec.core.rejection import Source
from edgespec.core.sampling import SamplingParams
from edgespec.errors import ModelError
from tui.app import ChatApp, ChatSettings
from tui.screens import HelpScreen
from tui.widgets import AssistantMessage, NoteMessage, UserMessage

from .test_tui_helpers import (
    ROUND_TIME,
    drive,
    fake_engine,
    panel_text,
    record_notifications,
    type_and_send,
    until_answered,
    until_ready,
    wait_until,
)

GREEDY = SamplingParams(temperature=0)


def rendered_text(visual) -> str:
    console = Console(width=100, file=io.StringIO(), record=True)
    console.print(getattr(visual, "_renderable", visual))
    return console.export_text()


def make_app(engine=None, **settings) -> ChatApp:
    engine = engine if engine is not None else fake_engine()
    settings.setdefault("max_tokens", 40)
    # auto's choices follow the wall clock: the panel tests need a deterministic drafter
    settings.setdefault("drafter", "hybrid")
    settings.setdefault("draft_length", 4)
    return ChatApp(lambda: engine, ChatSettings(**settings))


def test_loading_shows_progress_then_the_chat():
    release = threading.Event()

    def slow_factory(report):  # a factory may report its stages
        report("Downloading the fake models (first use)…")
        release.wait(10)
        return fake_engine()

    app = ChatApp(slow_factory, ChatSettings())
    notes = record_notifications(app)

    async def scenario(pilot):
        await wait_until(pilot, lambda: "Downloading the fake models" in str(app.query_one("#loading-text").render()))
        assert app.query_one("#loading").query_one(LoadingIndicator).display
        assert "loading" in app.prompt_input.placeholder
        assert "(loading…)" in panel_text(app)
        await type_and_send(pilot, "too early")  # typing works; sending waits for the models
        assert app.prompt_input.value == "too early"
        assert any("still loading" in m for m, _, _ in notes)
        release.set()
        await until_ready(pilot)
        await pilot.pause()
        assert not app.query("#loading")
        assert app.query_one("#welcome", NoteMessage)
        assert app.prompt_input.placeholder.startswith("Message")
        text = panel_text(app)
        assert "(measured in each turn)" in text and "speedup" in text

    drive(app, scenario)


def test_load_error_is_a_notification_and_the_app_stays_usable():
    def failing_factory():
        raise ModelError("failed to load target.gguf: not a GGUF file")

    app = ChatApp(failing_factory, ChatSettings())
    notes = record_notifications(app)

    async def scenario(pilot):
        await wait_until(pilot, lambda: app.load_error is not None)
        await pilot.pause()
        assert ("failed to load target.gguf: not a GGUF file", "error", "model failed to load") in notes
        error_note = app.query_one(NoteMessage)
        assert "not a GGUF file" in str(error_note.render()) and error_note.has_class("error")
        assert "(no model loaded)" in panel_text(app)
        await type_and_send(pilot, "hello")
        assert any(m == "no model loaded" for m, _, _ in notes)
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)

    drive(app, scenario)


def test_answer_streams_and_the_panel_shows_the_engines_stats():
    engine = fake_engine()
    app = make_app(engine)

    async def scenario(pilot):
        await until_ready(pilot)
        await type_and_send(pilot, "Explain speculative decoding")
        await until_answered(pilot, 2)
        view = app.last_view
        stats = view.stats
        # The same engine, fresh, on the same messages gives the same answer and stats: the
        # panel's numbers are the engine's.
        expected = fake_engine().complete(app.conversation.messages()[:1], max_tokens=40, sampling=GREEDY)
        answer = app.conversation.entries[1]
        assert answer.role == "assistant" and answer.content == expected.text
        got, want = stats.to_dict(), expected.stats.to_dict()
        for stats_dict in (got, want):
            stats_dict.pop("cached_prompt_tokens")  # the calibration warmed the cache
        assert got == want
        assert stats.generated == 40 and 0 < stats.accepted < stats.drafted
        text = panel_text(app)
        speedup = stats.tokens_per_second * ROUND_TIME  # the fake's target-only speed is 1 / ROUND_TIME
        assert stats.speedup.basis == "curve" and stats.plain.rounds < 8  # hybrid: (almost) no plain step
        for value in (f"{stats.tokens_per_second:.1f} tok/s", f"{speedup:.2f}×",
                      f"{1 / ROUND_TIME:.1f} tok/s", f"(derived from curve, {stats.rounds} calls)",
                      f"{100 * stats.acceptance_rate:.0f}%", f"{stats.mean_accepted:.2f}",
                      f"drafted{stats.drafted:>{32 - len('drafted')}}",
                      f"accepted{stats.accepted:>{32 - len('accepted')}}",
                      f"{stats.prompt_tokens + stats.generated}/1024",
                      "turn 1 · hybrid k=4 · max tokens", "0 1 2 3 4", "time  draft 0% · target 100%"):
            assert value in text, value
        assert abs(speedup - stats.tokens_per_round) < 1e-9  # fixed clock: one target call per round
        assert stats.speedup.ratio == pytest.approx(speedup, rel=1e-12)
        # provenance: the green spans are exactly the accepted draft tokens
        widget = app.query_one(AssistantMessage)
        assert widget.text == expected.text
        assert widget.drafted_tokens == sum(t.source is Source.DRAFT for t in expected.tokens)
        assert widget.drafted_tokens == stats.accepted
        assert len(view.recent) == stats.rounds and sum(view.recent) == stats.accepted
        assert f"40 tok · {stats.tokens_per_second:.1f} tok/s · {speedup:.2f}× vs target-only" in str(
            widget.query_one(".meta").render())

    drive(app, scenario)


def test_escape_mid_answer_keeps_the_partial_answer_and_the_next_turn_works():
    engine = fake_engine()
    target = engine.target
    app = make_app(engine, max_tokens=400)
    notes = record_notifications(app)

    async def scenario(pilot):
        await until_ready(pilot)
        target.hold_after = len(target.calls) + 10  # freeze the generation mid-answer
        await type_and_send(pilot, "Write a long story")
        await wait_until(pilot, lambda: not target.gate.is_set() and app.turn is not None
                         and len(app.turn.widget.pieces) >= 8)
        assert "streaming" in panel_text(app)
        assert "speed now" in panel_text(app) and "–" not in panel_text(app).split("speed now")[1].split("\n")[0]
        await pilot.press("escape")
        target.gate.set()
        await until_answered(pilot, 2)
        partial = app.conversation.entries[1]
        assert partial.meta["finish_reason"] == "stopped"
        assert 8 <= partial.meta["stats"]["generated"] < 400
        assert partial.content == app.query_one(AssistantMessage).text
        assert "stopped" in str(app.query_one(AssistantMessage).query_one(".meta").render())
        assert "turn 1 · hybrid k=4 · stopped" in panel_text(app)
        # the engine was left ready: the next turn runs, with the partial answer in its prompt
        await type_and_send(pilot, "/max 12")
        await type_and_send(pilot, "Now a short one")
        await until_answered(pilot, 4)
        assert [e.role for e in app.conversation.entries] == ["user", "assistant"] * 2
        assert app.conversation.entries[3].meta["finish_reason"] == "length"
        assert app.conversation.entries[3].meta["stats"]["generated"] == 12
        assert app.conversation.messages()[1]["content"] == partial.content
        assert not [n for n in notes if n[1] == "error"]

    drive(app, scenario)


def test_switching_drafter_between_turns_and_the_measured_baseline():
    app = make_app(max_tokens=30)

    async def scenario(pilot):
        await until_ready(pilot)
        text = panel_text(app)
        assert "target-only" in text and "(measured in each turn)" in text
        seen = []
        for _ in range(3):
            await pilot.press("ctrl+d")
            seen.append(app.drafter)
        assert seen == ["model", "lookup", "none"]
        assert "next  none · k=4" in panel_text(app)
        await type_and_send(pilot, "plain decoding please")
        await until_answered(pilot, 2)
        first = app.last_view.stats
        assert first.drafted == 0 and app.query(AssistantMessage).last().drafted_tokens == 0
        assert first.speedup.ratio == 1.0
        assert first.speedup.target_only_tokens_per_second == first.tokens_per_second
        text = panel_text(app)
        assert "(measured in turn, 30 steps)" in text and "1.00×" in text
        assert app.conversation.entries[1].meta["baseline"] == "measured in turn, 30 steps"
        await pilot.press("ctrl+d")
        assert app.drafter == "auto"
        await pilot.press("ctrl+d")
        assert app.drafter == "hybrid"
        await type_and_send(pilot, "and now speculate")
        await until_answered(pilot, 4)
        second = app.last_view.stats
        assert second.drafted > 0 and second.accepted > 0
        assert app.conversation.entries[3].meta["drafter"] == "hybrid"
        text = panel_text(app)
        assert "turn 2 · hybrid k=4" in text
        # on a steady machine the same-moment figure is the ratio of the two turns' speeds
        assert f"{second.tokens_per_second / first.tokens_per_second:.2f}×" in text

    drive(app, scenario)


def test_without_a_draft_model_the_cycle_skips_model_drafters():
    app = make_app(fake_engine(with_draft=False, drafter="lookup"), drafter="lookup")
    notes = record_notifications(app)

    async def scenario(pilot):
        await until_ready(pilot)
        assert app.drafter == "lookup"
        await pilot.press("ctrl+d")
        assert app.drafter == "none"
        await pilot.press("ctrl+d")
        assert app.drafter == "auto"  # auto runs without a draft model: lookup or plain steps
        await pilot.press("ctrl+d")
        assert app.drafter == "lookup"
        await type_and_send(pilot, "/drafter model")
        assert app.drafter == "lookup" and app.prompt_input.value == "/drafter model"
        assert any("needs a draft model" in m and s == "error" for m, s, _ in notes)

    drive(app, scenario)


def test_a_model_drafter_without_a_draft_model_falls_back_to_lookup():
    app = make_app(fake_engine(with_draft=False, drafter="lookup"), drafter="hybrid")
    notes = record_notifications(app)

    async def scenario(pilot):
        await until_ready(pilot)
        assert app.drafter == "lookup" and "next  lookup" in panel_text(app)
        assert ("no draft model loaded: drafter hybrid → lookup", "warning", "") in notes

    drive(app, scenario)


def test_context_full_then_prompt_too_long_then_clear():
    app = make_app(fake_engine(n_ctx=120), max_tokens=500)
    notes = record_notifications(app)

    async def scenario(pilot):
        await until_ready(pilot)
        await type_and_send(pilot, "hi")
        await until_answered(pilot, 2)
        assert app.conversation.entries[1].meta["finish_reason"] == "context"
        assert ("context full: clear the conversation (ctrl+l)", "warning", "context full") in notes
        assert "context full" in panel_text(app) and "120/120" in panel_text(app)
        # the conversation no longer fits: the message is not lost, it goes back to the input
        await type_and_send(pilot, "and again")
        await wait_until(pilot, lambda: app.turn is None and app.prompt_input.value == "and again")
        assert any(s == "error" and "context holds 120" in m and "back in the input box" in m
                   for m, s, _ in notes)
        assert len(app.conversation) == 2 and len(app.query(UserMessage)) == 1
        await pilot.press("ctrl+l")
        assert len(app.conversation) == 0 and not app.query(UserMessage)
        await pilot.press("enter")  # the restored message, sent again
        await until_answered(pilot, 2)
        assert app.conversation.entries[0].content == "and again"

    drive(app, scenario)


@pytest.mark.parametrize("frame", [0.0, 0.3])
def test_a_streaming_answer_is_drawn_at_most_once_a_frame_and_whole_at_its_end(frame, monkeypatch):
    """Chunks update the answer's data as they come; the screen draws it at most once per
    ``frame`` seconds (the interface thread shares the cores with llama.cpp's), and the turn's
    end draws it whole."""
    engine = fake_engine()
    stream = engine.stream

    def paced(*args, **kwargs):  # a chunk every 40 ms: the answer streams onto a mounted widget
        for chunk in stream(*args, **kwargs):
            time.sleep(0.04)
            yield chunk

    engine.stream = paced
    app = make_app(engine, max_tokens=40, frame=frame)
    chunks, draws = [], []
    append, draw = AssistantMessage.append, AssistantMessage.draw
    monkeypatch.setattr(AssistantMessage, "append",
                        lambda self, *chunk: (chunks.append(time.monotonic()), append(self, *chunk)))
    monkeypatch.setattr(AssistantMessage, "draw",
                        lambda self: (draws.append(time.monotonic()), draw(self)))

    async def scenario(pilot):
        await until_ready(pilot)
        await type_and_send(pilot, "Explain speculative decoding")
        await until_answered(pilot, 2)
        widget = app.query_one(AssistantMessage)
        assert widget.text == app.conversation.entries[1].content and len(chunks) > 3
        assert str(widget.query_one(".body").content) == widget.text  # drawn whole at the end
        if frame == 0:
            assert len(draws) == len(chunks)
        else:
            assert 1 <= len(draws) < len(chunks)
            assert all(b - a >= frame * 0.9 for a, b in zip(draws, draws[1:]))

    drive(app, scenario)


def test_pasted_code_of_several_lines_is_sent_whole():
    """Textual's Input keeps a paste's first line only: the chat's keeps all of it behind a marker,
    sends it whole, and puts it back (as a marker) when the turn cannot run."""
    app = make_app(fake_engine(n_ctx=120), max_tokens=500)
    code = "def f(x):\r\n    return x + 1\n\nprint(f(2))"
    want = "Add type hints:def f(x):\n    return x + 1\n\nprint(f(2)) please"

    async def scenario(pilot):
        await until_ready(pilot)
        box = app.prompt_input
        box.value = "Add type hints:"
        box.post_message(events.Paste(code))
        await pilot.pause()
        assert box.value == "Add type hints:[paste 1: 4 lines]"
        box.post_message(events.Paste(" please"))  # one line goes in as it is
        await pilot.pause()
        await pilot.press("enter")
        await until_answered(pilot, 2)
        assert app.conversation.entries[0].content == want
        assert box.value == "" and box.message() == ""
        # the context is full now: a pasted message that cannot run comes back, still whole
        box.post_message(events.Paste("a\nb"))
        await pilot.pause()
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.turn is None and box.value == "[paste 1: 2 lines]")
        assert box.message() == "a\nb" and len(app.conversation) == 2

    drive(app, scenario)


def test_every_key_binding_fires(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    app = make_app(max_tokens=16)

    async def scenario(pilot):
        await until_ready(pilot)
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        help_text = rendered_text(app.screen.query_one("#help-keys").render())
        for binding in ChatApp.BINDINGS:  # the help lists every key the app binds
            assert binding.key in help_text, binding.key
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("escape")  # nothing to stop: harmless
        await pilot.press("ctrl+k")
        assert app.draft_length == 5 and "k=5" in panel_text(app)
        await pilot.press("ctrl+j", "ctrl+j")
        assert app.draft_length == 3
        await pilot.press("ctrl+t")
        assert app.sampling.temperature == 0.3 and "temp 0.3" in panel_text(app)
        await pilot.press("ctrl+t", "ctrl+t", "ctrl+t")
        assert app.sampling.temperature == 0.0
        await pilot.press("ctrl+d")
        assert app.drafter == "model"
        await type_and_send(pilot, "hello")
        await until_answered(pilot, 2)
        answer = app.conversation.last_answer()
        await pilot.press("ctrl+y")
        assert app.clipboard == answer
        await pilot.press("ctrl+o")
        message = app.query_one(AssistantMessage)
        assert not app.coloured and "colours off" in panel_text(app)
        await wait_until(pilot, lambda: message.settled)
        assert message.query_one(Markdown).display and not message.query_one(".body").display
        assert message.query_one(Markdown).source == answer
        await pilot.press("ctrl+o")
        assert app.coloured and message.query_one(".body").display
        await pilot.press("ctrl+s")
        md, js = sorted(tmp_path.glob("edgespec-chat-*.md")), sorted(tmp_path.glob("edgespec-chat-*.json"))
        assert len(md) == len(js) == 1
        assert "## You\n\nhello" in md[0].read_text() and answer in md[0].read_text()
        data = json.loads(js[0].read_text())
        assert [m["role"] for m in data["messages"]] == ["user", "assistant"]
        assert data["messages"][1]["meta"]["drafter"] == "model"
        await pilot.press("ctrl+l")
        assert len(app.conversation) == 0 and not app.query(AssistantMessage)
        await pilot.press("ctrl+q")
        await wait_until(pilot, lambda: app.return_code is not None, what="the app to exit")

    drive(app, scenario)


def test_ctrl_q_mid_answer_stops_the_generation_first():
    engine = fake_engine(delay=0.01)
    app = make_app(engine, max_tokens=5000)

    async def scenario(pilot):
        await until_ready(pilot)
        await type_and_send(pilot, "go on forever")
        await wait_until(pilot, lambda: app.turn is not None and len(app.turn.widget.pieces) > 3)
        await pilot.press("ctrl+q")
        await wait_until(pilot, lambda: app.return_code is not None, what="the app to exit")
        assert app._idle.is_set()  # the worker thread has closed the engine's generator

    drive(app, scenario)
    assert not engine._lock.locked()  # the engine is free: it can be closed safely


def test_markdown_view_streams_when_colours_are_off():
    app = make_app()

    async def scenario(pilot):
        await until_ready(pilot)
        await pilot.press("ctrl+o")
        await type_and_send(pilot, "hello")
        await until_answered(pilot, 2)
        message = app.query_one(AssistantMessage)
        await wait_until(pilot, lambda: message.settled)
        assert message.query_one(Markdown).source == app.conversation.last_answer()

    drive(app, scenario)


def test_slash_commands_and_bad_settings(tmp_path):
    app = make_app(max_tokens=8)
    notes = record_notifications(app)

    async def scenario(pilot):
        await until_ready(pilot)
        for bad, message in [("/temp warm", "temperature: expected a number"),
                             ("/temp -1", "temperature must be"),
                             ("/k 99", "draft length must be in [0, 64]"),
                             ("/drafter fast", "unknown drafter 'fast'"),
                             ("/max 0", "max tokens must be >= 1"),
                             ("/frobnicate", "unknown command /frobnicate")]:
            await type_and_send(pilot, bad)
            assert app.prompt_input.value == bad  # kept, to fix it
            assert notes[-1][1:] == ("error", "bad setting") and message in notes[-1][0], notes[-1]
        assert (app.sampling.temperature, app.draft_length, app.drafter) == (0.0, 4, "hybrid")
        for good in ("/temp 0.5", "/k 2", "/drafter lookup", "/max 6"):
            await type_and_send(pilot, good)
            assert app.prompt_input.value == ""
        assert (app.sampling.temperature, app.draft_length, app.drafter, app.max_tokens) == (0.5, 2, "lookup", 6)
        await type_and_send(pilot, "//slash text")
        await until_answered(pilot, 2)
        assert app.conversation.entries[0].content == "/slash text"
        path = tmp_path / "chat.json"
        await type_and_send(pilot, f"/save {path}")
        assert json.loads(path.read_text())["messages"][0]["content"] == "/slash text"
        await type_and_send(pilot, "/help")
        assert isinstance(app.screen, HelpScreen)

    drive(app, scenario)


def test_command_palette_lists_the_chat_actions():
    app = make_app()

    async def scenario(pilot):
        titles = [c.title for c in app.get_system_commands(app.screen)]
        for title in ("Cycle drafter", "Toggle provenance colours", "Save the chat", "Stop the answer"):
            assert title in titles

    drive(app, scenario)


def test_cli_chat_options():
    runner = CliRunner()
    result = runner.invoke(cli, ["chat", "--help"])
    assert result.exit_code == 0
    for option in ("--pair", "--drafter", "--draft-length", "--temperature", "--seed", "--ngl",
                   "--threads", "--ctx", "--max-tokens"):
        assert option in result.output
    result = runner.invoke(cli, ["chat", "--temperature", "-1"])  # fails before the screen opens
    assert result.exit_code == 2 and "error: temperature must be" in result.output


def test_a_plain_turn_reads_1x_when_the_target_slows_down_after_loading():
    engine = fake_engine()
    app = make_app(engine, drafter="none", max_tokens=24)

    async def scenario(pilot):
        await until_ready(pilot)
        engine.target.slowdown = 2.0  # every target call twice as slow as when the engine loaded
        await type_and_send(pilot, "plain decoding on a busier machine")
        await until_answered(pilot, 2)
        stats = app.last_view.stats
        assert stats.drafted == 0
        assert stats.tokens_per_second == pytest.approx(1 / (2 * ROUND_TIME))  # it did slow down
        assert "1.00×" in panel_text(app).split("speedup")[1].split("\n")[0]
        assert "(measured in turn, 24 steps)" in panel_text(app)
        assert "1.00× vs target-only" in str(app.query_one(AssistantMessage).query_one(".meta").render())
        assert app.conversation.entries[1].meta["speedup"] == 1.0

    drive(app, scenario)
