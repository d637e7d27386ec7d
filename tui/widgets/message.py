"""One widget per chat message.

An answer keeps its tokens with their provenance, so it can be shown two ways:

- *coloured* (the default): the raw text, each token coloured by where it came from: accepted
  from the drafter, or produced by the target itself. Markdown would hide that per-token
  information, so this view shows the text as the model wrote it.
- *plain*: the same text rendered as Markdown.

The colour toggle switches every answer between the two views, including the one streaming.
"""

from __future__ import annotations

from typing import Iterable

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Markdown, Static

from edgespec.core.rejection import Source

#: Accepted draft tokens; everything the target produced itself keeps the default colour.
DRAFT_STYLE = "#5fd75f"
TARGET_STYLE = ""


def is_drafted(source: Source) -> bool:
    """True for a drafted token the target accepted; CORRECTED, BONUS and TARGET tokens are
    sampled by the target itself."""
    return source is Source.DRAFT


class UserMessage(Static):
    """What the user typed (shown verbatim, never parsed as markup)."""

    def __init__(self, content: str, **kwargs) -> None:
        super().__init__(Text(content), **kwargs)
        self.content = content
        self.border_title = "you"


class NoteMessage(Static):
    """An explanatory note in the conversation (welcome text, loading state, errors)."""


class AssistantMessage(Vertical):
    """A streamed answer with per-token provenance."""

    def __init__(self, *, coloured: bool = True, label: str = "edgespec", **kwargs) -> None:
        super().__init__(**kwargs)
        self.pieces: list[tuple[str, bool]] = []  # (text, drafted)
        self.coloured = coloured
        self.streaming = True
        self.border_title = label
        self._meta = "generating… (escape stops)"
        self._md_busy = False
        self._md_dirty = False
        self._ready = False  # children composed: chunks that arrive earlier are kept and shown then

    def compose(self) -> ComposeResult:
        yield Static(classes="body")
        yield Markdown("", classes="body-md")
        yield Static(classes="meta")

    def on_mount(self) -> None:
        self._ready = True
        self._show_mode()

    # ---- content -----------------------------------------------------------------------------

    @property
    def text(self) -> str:
        return "".join(piece for piece, _ in self.pieces)

    @property
    def drafted_tokens(self) -> int:
        return sum(1 for _, drafted in self.pieces if drafted)

    def append(self, tokens: Iterable, text: str) -> None:
        """Add one chunk: its tokens (``TokenInfo``) and its confirmed text (shown by the next
        :meth:`draw`). Text not covered by a token (a UTF-8 tail flushed at the end) is shown
        as target text."""
        covered = []
        for info in tokens:
            covered.append(info.text)
            if info.text:
                self.pieces.append((info.text, is_drafted(info.source)))
        rest = text[len("".join(covered)):] if text.startswith("".join(covered)) else ""
        if rest:
            self.pieces.append((rest, False))

    def draw(self) -> None:
        """Show the text appended so far (the chat draws a streaming answer at its own pace)."""
        self._render_body()

    def finish(self, meta: str) -> None:
        self.streaming = False
        self.set_meta(meta)
        self._render_body()

    def set_meta(self, meta: str) -> None:
        self._meta = meta
        if self._ready:
            self.query_one(".meta", Static).update(Text(meta))

    # ---- views -------------------------------------------------------------------------------

    def coloured_text(self, coloured: bool = True) -> Text:
        text = Text()
        for piece, drafted in self.pieces:
            text.append(piece, style=(DRAFT_STYLE if drafted else TARGET_STYLE) if coloured else "")
        if not text:
            text = Text("…" if self.streaming else "(no text)", style="dim")
        return text

    def set_coloured(self, coloured: bool) -> None:
        if coloured != self.coloured:
            self.coloured = coloured
            self._show_mode()

    def _show_mode(self) -> None:
        if not self._ready:
            return
        self.query_one(".body", Static).display = self.coloured
        self.query_one(".body-md", Markdown).display = not self.coloured
        self.query_one(".meta", Static).update(Text(self._meta))
        self._render_body()

    def _render_body(self) -> None:
        if not self._ready:
            return
        if self.coloured:
            self.query_one(".body", Static).update(self.coloured_text())
        else:
            self._md_dirty = True
            if not self._md_busy:
                self._md_busy = True
                self.run_worker(self._update_markdown(), group="markdown", exit_on_error=False)

    async def _update_markdown(self) -> None:
        try:
            while self._md_dirty:
                self._md_dirty = False
                await self.query_one(".body-md", Markdown).update(self.text or "…")
        finally:
            self._md_busy = False

    @property
    def settled(self) -> bool:
        """No Markdown update pending (for tests)."""
        return not self._md_busy
