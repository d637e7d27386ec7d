"""The message input: Textual's Input without the editing keys the chat uses for itself, and
with pasted text of several lines kept whole.

Textual's Input keeps the first line of a paste and drops the rest, so code pasted to be edited
would lose all but its first line without a word. A paste of several lines here goes in as one
marker (``[paste 1: 18 lines]``) that stands for the text; the message sent has each marker
replaced by what it stands for (:meth:`ChatInput.message`).
"""

from __future__ import annotations

from textual import events
from textual.binding import Binding
from textual.widgets import Input

#: Input binds ctrl+d (delete right) and ctrl+k (delete to the end): the chat uses them for the
#: drafter and the draft length (the Delete key still deletes to the right).
CHAT_KEYS = {"ctrl+d", "ctrl+k", "ctrl+j"}


def _without_chat_keys(binding: Binding) -> Binding | None:
    keys = [k for k in binding.key.split(",") if k.strip() not in CHAT_KEYS]
    if not keys:
        return None
    return Binding(",".join(keys), binding.action, binding.description, show=binding.show,
                   key_display=binding.key_display, priority=binding.priority)


class ChatInput(Input, inherit_bindings=False):
    """One-line message input; a paste of several lines is one marker standing for its text."""

    BINDINGS = [b for b in map(_without_chat_keys, Input.BINDINGS) if b is not None]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._pastes: dict[str, str] = {}  # marker -> the text it stands for

    def put(self, text: str) -> None:
        """Insert ``text`` at the cursor: as is if it is one line, else as a marker."""
        text = text.replace("\r\n", "\n").replace("\r", "\n")
        if "\n" in text:
            marker = f"[paste {len(self._pastes) + 1}: {text.count(chr(10)) + 1} lines]"
            self._pastes[marker] = text
            text = marker
        if self.selection.is_empty:
            self.insert_text_at_cursor(text)
        else:
            self.replace(text, *self.selection)

    def message(self, value: str | None = None) -> str:
        """The message ``value`` (default: what is in the box) stands for: markers expanded."""
        value = self.value if value is None else value
        for marker, text in self._pastes.items():
            value = value.replace(marker, text)
        return value

    def restore(self, message: str) -> None:
        """Put a message back in the empty box (a turn that could not run), pastes as markers."""
        self.value = ""
        self._pastes.clear()
        self.put(message)

    def _on_paste(self, event: events.Paste) -> None:
        event.prevent_default()  # not Input's handler too: it would insert the first line again
        event.stop()
        if event.text:
            self.put(event.text)

    def watch_value(self, value: str) -> None:
        if not value:  # sent or cleared: the markers go with the text
            self._pastes.clear()
