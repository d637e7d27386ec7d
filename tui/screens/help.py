"""The help screen: keys, slash commands, and what the panel means."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from tui.widgets.message import DRAFT_STYLE

ABOUT = (
    "A small draft model (or prompt lookup) guesses the next few tokens; the target model "
    "checks all the guesses in one pass and keeps the ones it agrees with. The answer is "
    "exactly what the target alone would write, only faster. "
)


class HelpScreen(ModalScreen[None]):
    """Lists the keys (from the app's bindings) and the slash commands."""

    BINDINGS = [
        Binding("escape,f1,q", "app.pop_screen", "Close help"),
    ]

    def __init__(self, keys: list[tuple[str, str]], commands: list[tuple[str, str]]) -> None:
        super().__init__()
        self.keys = keys
        self.commands = commands

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box") as box:
            box.border_title = "help"
            box.border_subtitle = "escape closes"
            yield Static(self._about(), id="help-about")
            yield Static(self._table("key", self.keys), id="help-keys")
            yield Static(self._table("command", self.commands), id="help-commands")

    def _about(self) -> Text:
        return Text.assemble(
            ABOUT,
            ("drafted", DRAFT_STYLE), " text was guessed and accepted; default-coloured text the "
            "target wrote itself. The panel compares this turn's speed with target-only decoding.",
        )

    @staticmethod
    def _table(title: str, rows: list[tuple[str, str]]) -> Table:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold", no_wrap=True)
        table.add_column()
        table.add_row(Text(title, style="dim"), Text("what it does", style="dim"))
        for key, text in rows:
            table.add_row(key, text)
        return table
