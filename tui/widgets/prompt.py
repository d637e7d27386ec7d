"""The message input: Textual's Input without the editing keys the chat uses for itself."""

from __future__ import annotations

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
    """One-line message input."""

    BINDINGS = [b for b in map(_without_chat_keys, Input.BINDINGS) if b is not None]
