"""Screens pushed over the chat: help."""

from .help import HelpScreen

__all__ = ["HelpScreen"]
