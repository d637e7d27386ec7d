"""``edgespec chat``: a Textual chat that shows, live, what speculation buys.

Layout: the conversation and the input on the left, the speculation panel on the right.
The engine is built by a *factory* in a worker thread (loading shows progress, and tests pass
a factory that returns a fake engine). Each answer is generated in another worker thread; its
chunks reach the UI as messages (``post_message`` does not block, so the UI never slows the
generation it is measuring). Escape sets the turn's stop flag and cancels the worker; the
thread then closes the engine's generator, which leaves the engine ready for the next turn.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Header, Input, LoadingIndicator, Static
from textual.worker import get_current_worker

from edgespec import config
from edgespec.core.sampling import SamplingParams
from edgespec.core.stats import Stats
from edgespec.errors import ConfigError, ContextOverflowError, EdgespecError
from edgespec.runtime.constraint import Constraint
from edgespec.runtime import sources
from tui.conversation import Conversation, default_save_stem, short_meta
from tui.screens import HelpScreen
from tui.speed import RollingRate
from tui.throttle import Throttle
from tui.widgets import AssistantMessage, NoteMessage, StatsPanel, UserMessage
from tui.widgets.prompt import ChatInput
from tui.widgets.stats_panel import TurnView, fmt_k

#: Order in which ctrl+d cycles the drafter: the registry's.
DRAFTER_CYCLE = sources.NAMES
#: Values ctrl+t cycles the temperature through (/temp X sets any other).
TEMPERATURES = (0.0, 0.3, 0.7, 1.0)

WELCOME = (
    "Type a message and press Enter. While the answer streams, the panel on the right shows what "
    "the drafter does: a small model (or prompt lookup) guesses the next few tokens and the "
    "target model checks them all in one pass. Green text is guessed tokens the target accepted; "
    "the speedup compares this turn with the target decoding alone, both measured in this turn. "
    "F1: keys and commands."
)

COMMANDS = [
    ("/drafter NAME", f"drafter for the next turns: {', '.join(DRAFTER_CYCLE[:-1])} or "
                      f"{DRAFTER_CYCLE[-1]}"),
    ("/k N|auto", f"draft length (tokens drafted per round, 0-{config.MAX_DRAFT_LENGTH}; "
                  "auto: chosen each round)"),
    ("/temp X", "temperature (0 = greedy)"),
    ("/max N", "longest answer, in tokens"),
    ("/save [PATH]", "save the chat: Markdown, or JSON for a .json path"),
    ("/clear", "clear the conversation"),
    ("/help", "this screen"),
    ("//text", "send a message that starts with /"),
]


def describe_error(err: BaseException) -> str:
    """The user-facing text of an error: edgespec's own messages are already readable."""
    if isinstance(err, EdgespecError):
        return str(err)
    return f"{type(err).__name__}: {err}"


@dataclass
class ChatSettings:
    """Start-up settings (the CLI fills them from the same options as ``complete``)."""

    drafter: str = config.DEFAULT_DRAFTER
    draft_length: int | None = None  #: None: auto chooses, fixed drafters use the default
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = config.DEFAULT_MAX_TOKENS
    system: str | None = None
    #: what every answer must match (``--schema``, ``--json-object``, ``--grammar``), or None
    constraint: Constraint | None = None
    #: the fewest seconds between two draws of a streaming answer and its stats (tui.throttle)
    frame: float = 0.25


# ---- messages from the worker threads ----------------------------------------------------------


class LoadStage(Message):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class EngineReady(Message):
    def __init__(self, engine) -> None:
        super().__init__()
        self.engine = engine


class LoadFailed(Message):
    """The models did not load: no engine."""

    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


@dataclass(eq=False)
class Turn:
    """One question and its answer, while it is being generated."""

    number: int
    user_text: str
    prompt: list[dict[str, str]]
    drafter: str
    draft_length: int | None
    sampling: SamplingParams
    max_tokens: int
    user_widget: UserMessage
    widget: AssistantMessage
    view: TurnView
    stop: threading.Event = field(default_factory=threading.Event)
    rate: RollingRate = field(default_factory=RollingRate)
    rounds_seen: int = 0
    accepted_seen: int = 0


class TurnChunk(Message):
    def __init__(self, turn: Turn, text: str, tokens: list, stats: Stats) -> None:
        super().__init__()
        self.turn, self.text, self.tokens, self.stats = turn, text, tokens, stats


class TurnEnded(Message):
    """``reason``: the engine's finish reason ("stop", "length", "context"), "stopped"
    (escape), "overflow" (the prompt does not fit) or "error"."""

    def __init__(self, turn: Turn, reason: str, error: str | None) -> None:
        super().__init__()
        self.turn, self.reason, self.error = turn, reason, error


FINISH_LABELS = {"stop": "done", "length": "max tokens", "context": "context full", "stopped": "stopped"}


class ChatApp(App[None]):
    """The chat. ``engine_factory`` builds the :class:`edgespec.Engine` in a worker thread; it
    is called with no argument, or with a ``report(stage: str)`` callback if it takes one."""

    CSS_PATH = "chat.tcss"
    TITLE = "edgespec chat"

    BINDINGS = [
        Binding("ctrl+q", "quit", "Quit", priority=True),
        Binding("f1", "help", "Help"),
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+d", "cycle_drafter", "Drafter"),
        Binding("ctrl+k", "draft_length(1)", "k±", key_display="^k/^j"),
        Binding("ctrl+j", "draft_length(-1)", "k-", show=False),
        Binding("ctrl+t", "cycle_temperature", "Temp"),
        Binding("ctrl+o", "toggle_colour", "Colour"),
        Binding("ctrl+l", "clear", "Clear"),
        Binding("ctrl+y", "copy_answer", "Copy", show=False),
        Binding("ctrl+s", "save", "Save", show=False),
    ]

    KEY_HELP = [
        ("ctrl+q", "quit (stops the answer first)"),
        ("f1", "this help"),
        ("escape", "stop the answer; the partial answer stays in the conversation"),
        ("ctrl+d", f"cycle the drafter: {' → '.join(DRAFTER_CYCLE)} (plain decoding)"),
        ("ctrl+k / ctrl+j", "draft length up / down (tokens drafted per round)"),
        ("ctrl+t", "cycle the temperature: " + ", ".join(f"{t:g}" for t in TEMPERATURES)),
        ("ctrl+o", "colour tokens by provenance on / off (off: answers rendered as Markdown)"),
        ("ctrl+l", "clear the conversation"),
        ("ctrl+y", "copy the last answer to the clipboard"),
        ("ctrl+s", "save the chat as Markdown and JSON in the current directory"),
        ("ctrl+p", "command palette (every action above, by name)"),
    ]

    def __init__(self, engine_factory: Callable[..., object], settings: ChatSettings | None = None,
                 *, model_label: str = "") -> None:
        super().__init__()
        self.engine_factory = engine_factory
        self.settings = settings or ChatSettings()
        self.model_label = model_label
        self.engine = None
        self.conversation = Conversation(system=self.settings.system)
        self.drafter = self.settings.drafter
        self.draft_length = self.settings.draft_length
        self.sampling = self.settings.sampling
        self.max_tokens = self.settings.max_tokens
        self.coloured = True
        self.turn: Turn | None = None
        self.turn_count = 0
        self.last_view: TurnView | None = None
        self._draw_turn = Throttle(self, self.settings.frame, self._show_turn)
        self.load_stage = "Loading models…"
        self.load_error: str | None = None
        self._load_started = time.monotonic()
        self._idle = threading.Event()
        self._idle.set()
        self._engine_lock = threading.Lock()
        self._loaded_engine = None
        self._shutting_down = False

    # ---- layout ------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            with Vertical(id="chat"):
                with VerticalScroll(id="conversation"):
                    with Vertical(id="loading"):
                        yield LoadingIndicator()
                        yield Static(self.load_stage, id="loading-text")
                    # takes the space left below short conversations, so the anchored view
                    # (which keeps the bottom in sight) still shows them from the top
                    yield Static(id="filler")
                yield ChatInput(placeholder="loading models… (type away)", id="prompt")
            yield StatsPanel(id="stats")
        yield Footer(show_command_palette=False)

    @property
    def panel(self) -> StatsPanel:
        return self.query_one(StatsPanel)

    @property
    def prompt_input(self) -> ChatInput:
        return self.query_one("#prompt", ChatInput)

    @property
    def conversation_view(self) -> VerticalScroll:
        return self.query_one("#conversation", VerticalScroll)

    def on_mount(self) -> None:
        self.sub_title = self.model_label
        self._show_settings()
        self._load_timer = self.set_interval(0.5, self._tick_loading)
        self.prompt_input.focus()
        self.load_models()

    def _show_settings(self, **extra) -> None:
        self.panel.show(drafter=self.drafter, draft_length=self.draft_length,
                        temperature=self.sampling.temperature, coloured=self.coloured, **extra)

    # ---- loading -----------------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="load", exit_on_error=False)
    def load_models(self) -> None:
        self.post_message(LoadStage("Loading models…"))
        try:
            engine = self._build_engine()
        except BaseException as err:  # noqa: BLE001 - shown to the user, the app stays open
            self.post_message(LoadFailed(describe_error(err)))
            return
        with self._engine_lock:
            if self._shutting_down:  # the app quit while loading: nobody else will close it
                if hasattr(engine, "close"):
                    engine.close()
                return
            self._loaded_engine = engine
        self.post_message(EngineReady(engine))

    def _build_engine(self):
        """Call the factory; one that takes an argument gets a ``report(stage)`` callback."""
        try:
            wants_report = bool(inspect.signature(self.engine_factory).parameters)
        except (TypeError, ValueError):
            wants_report = False
        if wants_report:
            return self.engine_factory(lambda text: self.post_message(LoadStage(text)))
        return self.engine_factory()

    def _tick_loading(self) -> None:
        if self.engine is not None or self.load_error is not None:
            self._load_timer.stop()
            return
        elapsed = time.monotonic() - self._load_started
        self.query_one("#loading-text", Static).update(f"{self.load_stage} {elapsed:.0f} s")

    def on_load_stage(self, message: LoadStage) -> None:
        self.load_stage = message.text
        if self.engine is None:
            self.query_one("#loading-text", Static).update(message.text)

    def on_load_failed(self, message: LoadFailed) -> None:
        self.load_error = message.error
        self.query_one("#loading").remove()
        self.conversation_view.mount(NoteMessage(
            f"Could not load the models: {message.error}\n\nQuit with ctrl+q and check the model "
            "options (edgespec chat --help).", classes="error"), before="#filler")
        self.prompt_input.placeholder = "no model loaded"
        self.panel.show(note="no model loaded")
        self.notify(message.error, title="model failed to load", severity="error", timeout=10)

    def on_engine_ready(self, message: EngineReady) -> None:
        self.engine = message.engine
        choice = getattr(self.engine, "draft_choice", None)
        if choice is not None:  # the draft was picked for this target: say which and why
            picked = f"draft {choice.draft}: {choice.reason}" if choice.draft else choice.reason
            self.notify(picked, title="draft model", timeout=8)
        if self.drafter not in sources.usable(self._has_draft_model(), self._has_mtp()):
            self.notify(f"no draft model loaded: drafter {self.drafter} → lookup", severity="warning")
            self.drafter = "lookup"
        self.query_one("#loading").remove()
        self.conversation_view.mount(NoteMessage(WELCOME, id="welcome"), before="#filler")
        if not self.model_label:
            self.sub_title = self._engine_label()
        prompt = self.prompt_input
        prompt.placeholder = "Message (Enter sends · F1 help)"
        prompt.focus()
        self._show_settings(n_ctx=getattr(self.engine.target, "n_ctx", None), note=None)

    def _engine_label(self) -> str:
        names = [getattr(getattr(self.engine, role, None), "path", None) for role in ("target", "draft")]
        names = [Path(n).stem for n in names if n is not None]
        return " + ".join(names)

    def _has_draft_model(self) -> bool:
        return self.engine is None or getattr(self.engine, "draft", None) is not None

    def _has_mtp(self) -> bool:
        return self.engine is not None and getattr(self.engine, "mtp", None) is not None

    # ---- turns -------------------------------------------------------------------------------

    @on(Input.Submitted, "#prompt")
    def on_prompt_submitted(self, event: Input.Submitted) -> None:
        text = self.prompt_input.message(event.value)
        if not text.strip():
            return
        if text.startswith("/") and not text.startswith("//"):
            if self.run_command(text):
                self.prompt_input.value = ""
            return
        self.start_turn(text[1:] if text.startswith("//") else text)

    def start_turn(self, text: str) -> None:
        if self.engine is None:
            self.notify("the models are still loading: send it again in a moment"
                        if self.load_error is None else "no model loaded", severity="warning")
            return
        if self.turn is not None:
            self.notify("still answering: wait, or press escape to stop", severity="warning")
            return
        self.prompt_input.value = ""
        self.turn_count += 1
        label = f"edgespec · {self.drafter} k={fmt_k(self.draft_length, self.drafter)}"
        user_widget = UserMessage(text, classes="user")
        widget = AssistantMessage(coloured=self.coloured, label=label, classes="assistant")
        view = TurnView(self.turn_count, self.drafter, self.draft_length)
        turn = Turn(self.turn_count, text, self.conversation.messages() + [{"role": "user", "content": text}],
                    self.drafter, self.draft_length, self.sampling, self.max_tokens,
                    user_widget, widget, view)
        self.conversation_view.mount(user_widget, widget, before="#filler")
        self.conversation_view.anchor()  # jump to the new message, and follow the answer
        self.turn = turn
        self._idle.clear()
        self.panel.show(turn=view)
        self.refresh_bindings()
        self.generate(turn)

    @work(thread=True, exclusive=True, group="generate", exit_on_error=False)
    def generate(self, turn: Turn) -> None:
        worker = get_current_worker()
        reason, error = "error", None
        stream = None
        try:
            stream = self.engine.stream(turn.prompt, max_tokens=turn.max_tokens, sampling=turn.sampling,
                                        drafter=turn.drafter, draft_length=turn.draft_length,
                                        constraint=self.settings.constraint)
            for chunk in stream:
                # copy the live stats: the engine goes on updating them in this thread
                self.post_message(TurnChunk(turn, chunk.text, list(chunk.tokens), copy.deepcopy(chunk.stats)))
                if chunk.finish_reason:
                    reason = chunk.finish_reason
                    break
                if turn.stop.is_set() or worker.is_cancelled:
                    reason = "stopped"
                    break
        except ContextOverflowError as err:
            reason, error = "overflow", str(err)
        except BaseException as err:  # noqa: BLE001 - shown as a notification
            error = describe_error(err)
        finally:
            if stream is not None:
                try:
                    stream.close()  # the engine's finally-blocks leave it ready for the next turn
                except BaseException as err:  # noqa: BLE001
                    error = error or describe_error(err)
            self._idle.set()
            self.post_message(TurnEnded(turn, reason, error))

    def on_turn_chunk(self, message: TurnChunk) -> None:
        turn = message.turn
        if turn is not self.turn:
            return
        turn.widget.append(message.tokens, message.text)
        stats = message.stats
        if not turn.rate.points:
            turn.rate.start(stats.time_prefill)
        turn.rate.add(stats.time_total, stats.generated)
        rounds = stats.rounds - turn.rounds_seen
        if rounds > 0:
            accepted = stats.accepted - turn.accepted_seen
            turn.view.recent.extend([accepted // rounds] * rounds)
        turn.rounds_seen, turn.accepted_seen = stats.rounds, stats.accepted
        turn.view.stats = stats
        turn.view.now = turn.rate.rate
        self._draw_turn()

    def _show_turn(self) -> None:
        if self.turn is not None:
            self.turn.widget.draw()
            self.panel.show(turn=self.turn.view)

    def on_turn_ended(self, message: TurnEnded) -> None:
        turn, reason = message.turn, message.reason
        if turn is not self.turn:
            return
        self._draw_turn.cancel()  # (what follows draws the turn's end)
        self.turn = None
        view = turn.view
        if reason in ("overflow", "error"):
            turn.user_widget.remove()
            turn.widget.remove()
            self.turn_count -= 1
            if not self.prompt_input.value:
                self.prompt_input.restore(turn.user_text)
            if reason == "overflow":
                self.notify(f"{message.error}. Clear the conversation (ctrl+l) and send again: "
                            "your message is back in the input box.", title="context full",
                            severity="error", timeout=10)
            else:
                self.notify(f"{message.error} (your message is back in the input box)",
                            title="generation failed", severity="error", timeout=10)
            self.panel.show(turn=self.last_view)
            self.refresh_bindings()
            return
        view.finish = FINISH_LABELS.get(reason, reason)
        speedup = view.stats.speedup
        meta = {
            "drafter": turn.drafter, "draft_length": turn.draft_length,
            "temperature": turn.sampling.temperature, "finish_reason": reason,
            "speedup": speedup.ratio if speedup else None,  # (rounded once, where shown)
            "baseline": speedup.basis_text if speedup else None,
            "stats": view.stats.to_dict(),
        }
        self.conversation.add("user", turn.user_text)
        self.conversation.add("assistant", turn.widget.text, meta)
        turn.widget.finish(short_meta(meta))
        self.last_view = view
        self.panel.show(turn=view)
        if reason == "context":
            self.notify("context full: clear the conversation (ctrl+l)", title="context full",
                        severity="warning", timeout=10)
        self.refresh_bindings()

    # ---- actions -----------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "stop":
            return True if self.turn is not None else None  # None: shown, greyed out
        return True

    def action_stop(self) -> None:
        if self.turn is None:
            return
        self.turn.stop.set()
        self.workers.cancel_group(self, "generate")
        self.turn.widget.set_meta("stopping…")

    async def action_quit(self) -> None:
        self.action_stop()
        await asyncio.to_thread(self._idle.wait, 30)
        self.exit()

    def action_cycle_drafter(self) -> None:
        choices = sources.usable(self._has_draft_model(), self._has_mtp())
        i = choices.index(self.drafter) if self.drafter in choices else -1
        self.set_drafter(choices[(i + 1) % len(choices)])

    def set_drafter(self, name: str) -> None:
        if not sources.spec(name).usable(self._has_draft_model(), self._has_mtp()):
            raise ConfigError(f"drafter {name} needs a draft model: start with --drafter {name} "
                              "(or --draft NAME|PATH)")
        self.drafter = name
        self._settings_changed(f"drafter {name}")

    def action_draft_length(self, delta: int) -> None:
        current = self.draft_length if self.draft_length is not None else config.DEFAULT_DRAFT_LENGTH
        k = min(max(current + delta, 1), config.MAX_DRAFT_LENGTH)
        if k == self.draft_length:
            self.notify(f"draft length stays {k} (1-{config.MAX_DRAFT_LENGTH}; /k 0 turns drafting off)")
            return
        self.set_draft_length(k)

    def set_draft_length(self, k: int | None) -> None:
        if k is not None and not 0 <= k <= config.MAX_DRAFT_LENGTH:
            raise ConfigError(f"draft length must be in [0, {config.MAX_DRAFT_LENGTH}], got {k}")
        self.draft_length = k
        self._settings_changed(f"draft length {fmt_k(k, self.drafter)}")

    def action_cycle_temperature(self) -> None:
        t = self.sampling.temperature
        later = [x for x in TEMPERATURES if x > t]
        self.set_temperature(later[0] if later else TEMPERATURES[0])

    def set_temperature(self, t: float) -> None:
        self.sampling = replace(self.sampling, temperature=t)  # validates
        self._settings_changed(f"temperature {t:g}")

    def _settings_changed(self, what: str) -> None:
        self._show_settings()
        later = " (from the next turn)" if self.turn is not None else ""
        self.notify(f"{what}{later}", timeout=2)

    def action_toggle_colour(self) -> None:
        self.coloured = not self.coloured
        for message in self.query(AssistantMessage):
            message.set_coloured(self.coloured)
        self._show_settings()

    def action_clear(self) -> None:
        if self.turn is not None:
            self.notify("still answering: press escape first", severity="warning")
            return
        self.conversation.clear()
        for widget in self.query("#conversation > UserMessage, #conversation > AssistantMessage"):
            widget.remove()
        self.last_view = None
        self.panel.show(turn=None)
        self.notify("conversation cleared", timeout=2)

    def action_copy_answer(self) -> None:
        answer = self.conversation.last_answer()
        if answer is None:
            self.notify("no answer to copy yet", severity="warning")
            return
        self.copy_to_clipboard(answer)
        self.notify(f"copied the last answer ({len(answer)} characters)", timeout=3)

    def action_save(self, path: str | None = None) -> list[Path]:
        header = self._save_header()
        try:
            if path:
                paths = [self.conversation.save(Path(path).expanduser(), header)]
            else:
                stem = Path.cwd() / default_save_stem()
                paths = [self.conversation.save(stem.with_suffix(ext), header) for ext in (".md", ".json")]
        except OSError as err:
            self.notify(f"could not save: {err}", severity="error")
            return []
        self.notify("saved " + " and ".join(str(p) for p in paths), timeout=6)
        return paths

    def _save_header(self) -> dict:
        return {"models": self.sub_title or self.model_label}

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.KEY_HELP, COMMANDS))

    def get_system_commands(self, screen: Screen):
        yield from super().get_system_commands(screen)
        yield SystemCommand("Stop the answer", "Stop generating (escape)", self.action_stop)
        yield SystemCommand("Cycle drafter", f"{' → '.join(DRAFTER_CYCLE)} (ctrl+d)",
                            self.action_cycle_drafter)
        yield SystemCommand("Draft length +1", "ctrl+k", lambda: self.action_draft_length(1))
        yield SystemCommand("Draft length -1", "ctrl+j", lambda: self.action_draft_length(-1))
        yield SystemCommand("Cycle temperature", "ctrl+t", self.action_cycle_temperature)
        yield SystemCommand("Toggle provenance colours", "ctrl+o", self.action_toggle_colour)
        yield SystemCommand("Clear the conversation", "ctrl+l", self.action_clear)
        yield SystemCommand("Copy the last answer", "ctrl+y", self.action_copy_answer)
        yield SystemCommand("Save the chat", "Markdown and JSON in the current directory (ctrl+s)",
                            self.action_save)
        yield SystemCommand("Help", "Keys and commands (f1)", self.action_help)

    # ---- slash commands ----------------------------------------------------------------------

    def run_command(self, line: str) -> bool:
        """Run a ``/command``; a bad one is a notification. True when it ran."""
        name, _, arg = line[1:].strip().partition(" ")
        arg = arg.strip()
        try:
            if name == "drafter":
                self.set_drafter(arg)
            elif name == "k":
                self.set_draft_length(None if arg.strip() == "auto" else _parse(int, arg, "draft length"))
            elif name in ("temp", "temperature"):
                self.set_temperature(_parse(float, arg, "temperature"))
            elif name == "max":
                n = _parse(int, arg, "max tokens")
                if n < 1:
                    raise ConfigError(f"max tokens must be >= 1, got {n}")
                self.max_tokens = n
                self.notify(f"answers stop after {n} tokens", timeout=2)
            elif name == "save":
                return bool(self.action_save(arg or None))
            elif name == "clear":
                self.action_clear()
            elif name == "help":
                self.action_help()
            else:
                raise ConfigError(f"unknown command /{name}: F1 lists the commands")
        except ConfigError as err:
            self.notify(str(err), title="bad setting", severity="error")
            return False
        return True

    # ---- shutdown (the CLI owns the engine) --------------------------------------------------

    def close_engine(self, timeout: float = 30.0) -> None:
        """After :meth:`run`: wait for a running answer to stop, then free the models."""
        if self.turn is not None:
            self.turn.stop.set()
        self._idle.wait(timeout)
        with self._engine_lock:
            self._shutting_down = True
            engine = self._loaded_engine
        if engine is not None and hasattr(engine, "close"):
            engine.close()


def _parse(kind, text: str, what: str):
    try:
        return kind(text)
    except ValueError:
        raise ConfigError(f"{what}: expected a {'number' if kind is float else 'whole number'}, "
                          f"got {text!r}") from None
