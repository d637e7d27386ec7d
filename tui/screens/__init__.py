"""Screens pushed over the chat: help."""

from tui.screens.help import HelpScreen

__all__ = ["HelpScreen"]
