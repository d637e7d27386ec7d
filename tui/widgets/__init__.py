"""Widgets of the chat screen: one widget per message, and the speculation stats panel."""

from .message import AssistantMessage, NoteMessage, UserMessage
from .stats_panel import StatsPanel

__all__ = ["AssistantMessage", "NoteMessage", "StatsPanel", "UserMessage"]
