"""`edgespec verify`: registered on the main CLI (filled in below)."""

from __future__ import annotations

import click


def add_verify_command(group: click.Group) -> None:
    """Register ``edgespec verify`` on ``group``."""
