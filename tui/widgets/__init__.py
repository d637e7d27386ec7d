"""Widgets of the chat screen: one widget per message, and the speculation stats panel."""

from tui.widgets.message import AssistantMessage, NoteMessage, UserMessage
from tui.widgets.stats_panel import StatsPanel

__all__ = ["AssistantMessage", "NoteMessage", "StatsPanel", "UserMessage"]
