"""The chat history and its export to Markdown and JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any


@dataclass
class Entry:
    """One message: ``role`` is "system", "user" or "assistant". ``meta`` holds, for an
    answer, how it was made (drafter, draft length, temperature, finish reason, stats)."""

    role: str
    content: str
    meta: dict[str, Any] | None = None


@dataclass
class Conversation:
    system: str | None = None
    entries: list[Entry] = field(default_factory=list)

    def messages(self) -> list[dict[str, str]]:
        """The ``{"role", "content"}`` list the engine's chat template takes."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + [{"role": e.role, "content": e.content} for e in self.entries]

    def add(self, role: str, content: str, meta: dict[str, Any] | None = None) -> None:
        self.entries.append(Entry(role, content, meta))

    def clear(self) -> None:
        self.entries.clear()

    def last_answer(self) -> str | None:
        for entry in reversed(self.entries):
            if entry.role == "assistant":
                return entry.content
        return None

    def __len__(self) -> int:
        return len(self.entries)

    # ---- export -----------------------------------------------------------------------------

    def to_markdown(self, header: dict[str, Any] | None = None) -> str:
        lines = ["# edgespec chat", ""]
        for key, value in (header or {}).items():
            lines.append(f"- {key}: {value}")
        if header:
            lines.append("")
        if self.system:
            lines += ["## System", "", self.system, ""]
        for entry in self.entries:
            if entry.role == "user":
                lines += ["## You", "", entry.content, ""]
            else:
                note = f" ({describe(entry.meta)})" if entry.meta else ""
                lines += [f"## Assistant{note}", "", entry.content, ""]
        return "\n".join(lines).rstrip() + "\n"

    def to_json(self, header: dict[str, Any] | None = None) -> str:
        data = {
            **(header or {}),
            "messages": [
                {"role": e.role, "content": e.content, **({"meta": e.meta} if e.meta else {})}
                for e in ([Entry("system", self.system)] if self.system else []) + self.entries
            ],
        }
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"

    def save(self, path: Path, header: dict[str, Any] | None = None) -> Path:
        """Write Markdown, or JSON when ``path`` ends in ``.json``."""
        text = self.to_json(header) if path.suffix.lower() == ".json" else self.to_markdown(header)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return path


def describe(meta: dict[str, Any]) -> str:
    """``hybrid, k=4, temp 0 · 52 tok, 31.0 tok/s, 2.10x vs target-only · stopped``."""
    from tui.widgets.stats_panel import fmt_k

    drafter = meta.get("drafter") or "auto"
    parts = [f"{drafter}, k={fmt_k(meta.get('draft_length'), drafter)}, temp {meta.get('temperature'):g}"]
    stats = meta.get("stats") or {}
    speed = f"{stats.get('generated', 0)} tok, {stats.get('tokens_per_second', 0):.1f} tok/s"
    if meta.get("speedup"):
        speed += f", {meta['speedup']:.2f}x vs target-only"
    parts.append(speed)
    if meta.get("finish_reason") not in (None, "stop"):
        parts.append(str(meta["finish_reason"]))
    return " · ".join(parts)


def short_meta(meta: dict[str, Any]) -> str:
    """The line under an answer: ``60 tok · 40.0 tok/s · 2.00× · stopped``."""
    stats = meta.get("stats") or {}
    parts = [f"{stats.get('generated', 0)} tok", f"{stats.get('tokens_per_second', 0):.1f} tok/s"]
    if meta.get("speedup"):
        parts.append(f"{meta['speedup']:.2f}× vs target-only")
    finish = {"length": "max tokens", "context": "context full"}.get(meta.get("finish_reason"),
                                                                      meta.get("finish_reason"))
    if finish not in (None, "stop"):
        parts.append(str(finish))
    return " · ".join(parts)


def default_save_stem(now: datetime | None = None) -> str:
    return (now or datetime.now()).strftime("edgespec-chat-%Y%m%d-%H%M%S")
